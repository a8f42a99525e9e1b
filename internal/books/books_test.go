package books_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/internal/books"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/metrics"
	"github.com/crdipc/crdipc/ipc"
)

func TestMain(m *testing.M) {
	testenv.Main(m)
}

// TestBooksWithShippedRBAC runs the Book controller as its ServiceAccount,
// with only the permissions in config/rbac/books, and sends it requests.
func TestBooksWithShippedRBAC(t *testing.T) {
	env := testenv.Get(t)
	cfg := env.AsServiceAccount(t, "books")
	mgr := testenv.NewManager(t, cfg, func(o *ctrl.Options) {
		o.LeaderElection, o.LeaderElectionID = true, "books.crdipc.io"
		o.LeaderElectionNamespace, o.LeaderElectionReleaseOnCancel = install.SystemNamespace, true
	})
	if err := books.Register(mgr, ipc.Options{}); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "manager", mgr.Start)

	ns := env.Namespace(t)
	callCtx, cancelCall := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelCall()

	good := &libraryv1alpha1.Book{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sicp"},
		Spec:       libraryv1alpha1.BookSpec{Title: "Structure and Interpretation of Computer Programs", Author: "Abelson and Sussman", ISBN: "978-0-262-51087-5"},
	}
	if err := ipc.Call(callCtx, env.Client, good, ipc.Ready); err != nil {
		t.Fatalf("valid Book: %v", err)
	}
	if r := meta.FindStatusCondition(good.Status.Conditions, conditions.TypeReady); r.Reason != conditions.ReasonSucceeded {
		t.Fatalf("Ready = %+v", r)
	}

	bad := &libraryv1alpha1.Book{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "typo"},
		Spec:       libraryv1alpha1.BookSpec{Title: "Typo", Author: "Anon", ISBN: "978-0-262-51087-6"},
	}
	var terr *ipc.TerminalError
	if err := ipc.Call(callCtx, env.Client, bad, ipc.Ready); !errors.As(err, &terr) || terr.Reason != conditions.ReasonInvalidSpec {
		t.Fatalf("Book with a wrong ISBN checksum: got %v, want InvalidSpec", err)
	}

	// Each outcome is also an Event on the Book, recorded with the
	// controller's own permissions.
	for _, b := range []*libraryv1alpha1.Book{good, bad} {
		sel := fields.OneTermEqualSelector("involvedObject.uid", string(b.UID))
		testenv.Eventually(t, 10*time.Second, "one Event for Book "+b.Name, func(ctx context.Context) (bool, error) {
			var evs corev1.EventList
			if err := env.Client.List(ctx, &evs, client.InNamespace(ns), client.MatchingFieldsSelector{Selector: sel}); err != nil {
				return false, err
			}
			if len(evs.Items) != 1 {
				return false, fmt.Errorf("%d Events", len(evs.Items))
			}
			return true, nil
		})
	}

	// The receiver's metrics, read from the registry the manager serves. The receiver counts
	// a request once its status is written, so the count may trail the reply a little.
	book := map[string]string{"kind": "Book"}
	want := []struct {
		name   string
		labels map[string]string
		value  float64
	}{
		{"crdipc_requests_total", map[string]string{"kind": "Book", "result": "succeeded"}, 1},
		{"crdipc_requests_total", map[string]string{"kind": "Book", "result": "failed"}, 1},
		{"crdipc_request_duration_seconds_count", book, 1},
		{"crdipc_requests_in_flight", book, 0},
	}
	testenv.Eventually(t, 10*time.Second, "receiver metrics", func(context.Context) (bool, error) {
		mfs := metrics.Gather(t, crmetrics.Registry)
		var wrong []string
		for _, w := range want {
			if v, ok := mfs.Sample(w.name, w.labels); !ok || v != w.value {
				wrong = append(wrong, fmt.Sprintf("%s%v = %v (present %v), want %v", w.name, w.labels, v, ok, w.value))
			}
		}
		if len(wrong) > 0 {
			return false, errors.New(strings.Join(wrong, "; "))
		}
		return true, nil
	})
}
