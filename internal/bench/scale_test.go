package bench

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
)

// TestScaleOptionsRejected: bad sizes are refused before anything touches a cluster (there
// is none here). The benchmark itself runs in internal/cli's TestBenchScale.
func TestScaleOptionsRejected(t *testing.T) {
	for _, sizes := range [][]int{nil, {0}, {100, 100}, {1000, 100}, {-1, 10}} {
		o := DefaultScaleOptions
		o.Sizes = sizes
		_, err := MeasureScale(context.Background(), nil, o)
		if err == nil {
			t.Errorf("sizes %v: no error", sizes)
		} else if !strings.Contains(err.Error(), "size") {
			t.Errorf("sizes %v: %v, want it to name the sizes", sizes, err)
		}
	}
	o := DefaultScaleOptions
	o.Writers = 0
	if _, err := MeasureScale(context.Background(), nil, o); err == nil {
		t.Error("no writers: no error")
	}
	o = DefaultScaleOptions
	o.InProcess, o.TargetMetrics = true, "http://127.0.0.1:8080/metrics"
	if _, err := MeasureScale(context.Background(), nil, o); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Errorf("target metrics of a cluster this process serves: %v, want an error", err)
	}
}

// TestReadyTracker: only the population's Books count, a Book counts once however often it
// is seen Ready, a stale status (observedGeneration behind) does not count, and a Book
// that stops being Ready stops counting.
func TestReadyTracker(t *testing.T) {
	tr := &readyTracker{changed: make(chan struct{}, 1)}
	book := func(name string, gen, observed int64, ready metav1.ConditionStatus) *libraryv1alpha1.Book {
		b := &libraryv1alpha1.Book{ObjectMeta: metav1.ObjectMeta{Name: name, Generation: gen}}
		b.Status.ObservedGeneration = observed
		b.Status.Conditions = []metav1.Condition{{Type: conditions.TypeReady, Status: ready}}
		return b
	}
	tr.observe(book("pop-0", 1, 1, metav1.ConditionTrue))
	tr.observe(book("pop-0", 1, 1, metav1.ConditionTrue))
	tr.observe(book("pop-5000", 1, 1, metav1.ConditionTrue))
	tr.observe(book("pop-7", 2, 1, metav1.ConditionTrue))
	tr.observe(book("call-1000-1", 1, 1, metav1.ConditionTrue))
	tr.observe(book("pop-x", 1, 1, metav1.ConditionTrue))
	if tr.count != 2 {
		t.Fatalf("count %d, want 2 (pop-0 and pop-5000)", tr.count)
	}
	tr.observe(book("pop-0", 2, 2, metav1.ConditionFalse))
	if tr.count != 1 {
		t.Fatalf("count %d after pop-0 stopped being Ready, want 1", tr.count)
	}
}
