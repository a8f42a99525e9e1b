package operator

import (
	"math"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

func trackedReplica(name, pool, capacity string) *storagev1alpha1.CStorVolumeReplica {
	return &storagev1alpha1.CStorVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec:       storagev1alpha1.CStorVolumeReplicaSpec{Pool: pool, Capacity: resource.MustParse(capacity)},
	}
}

// The tracker's sums follow the events a cache delivers: adds, a replica grown, one moved
// to another pool (never done by the operator, but an update may carry anything), a
// repeated event, deletes (one as a tombstone with only its key), and a capacity beyond
// what the CRD admits, which counts its pool as full until that replica goes.
func TestUsageTrackerFollowsEvents(t *testing.T) {
	u := newUsageTracker()
	if _, ok := u.usage(); ok {
		t.Fatal("usage before the first list was delivered: want ok false")
	}
	synced := false
	u.synced = func() bool { return synced }
	h := u.handler()
	h.OnAdd(trackedReplica("a", "p1", "1Mi"), true)
	h.OnAdd(trackedReplica("b", "p1", "2Mi"), true)
	h.OnAdd(trackedReplica("c", "p2", "1Mi"), true)
	if _, ok := u.usage(); ok {
		t.Fatal("usage before synced: want ok false")
	}
	synced = true
	want := func(step string, expect map[string]int64) {
		t.Helper()
		got, ok := u.usage()
		if !ok {
			t.Fatalf("%s: not synced", step)
		}
		if len(got) != len(expect) {
			t.Fatalf("%s: usage %v, want %v", step, got, expect)
		}
		for p, n := range expect {
			if got[p] != n {
				t.Fatalf("%s: usage %v, want %v", step, got, expect)
			}
		}
	}
	const mi = 1 << 20
	want("three added", map[string]int64{"p1": 3 * mi, "p2": mi})

	h.OnUpdate(trackedReplica("a", "p1", "1Mi"), trackedReplica("a", "p1", "4Mi"))
	h.OnUpdate(trackedReplica("a", "p1", "4Mi"), trackedReplica("a", "p1", "4Mi"))
	want("a grown to 4Mi, then the same again", map[string]int64{"p1": 6 * mi, "p2": mi})

	h.OnUpdate(trackedReplica("c", "p2", "1Mi"), trackedReplica("c", "p3", "1Mi"))
	want("c on p3", map[string]int64{"p1": 6 * mi, "p3": mi})

	got, _ := u.usage()
	got["p1"] = 0
	want("after the caller changed its copy", map[string]int64{"p1": 6 * mi, "p3": mi})

	h.OnAdd(trackedReplica("huge", "p1", "9Ei"), false) // beyond int64: the CRD's pattern admits it
	want("an oversized replica", map[string]int64{"p1": math.MaxInt64, "p3": mi})

	h.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "ns/huge"})
	want("the oversized replica gone, as a tombstone", map[string]int64{"p1": 6 * mi, "p3": mi})

	h.OnDelete(trackedReplica("a", "p1", "4Mi"))
	h.OnDelete(trackedReplica("b", "p1", "2Mi"))
	h.OnDelete(trackedReplica("b", "p1", "2Mi"))
	want("a and b deleted, b twice", map[string]int64{"p3": mi})
}
