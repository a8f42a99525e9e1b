package controlplane_test

import (
	"bytes"
	"context"
	"slices"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/testenv"
)

// A list of replicas selected by spec.volume is served from the watch cache's index of that
// field (customResourceStorage): it fetches only the replicas of that volume, in any
// namespace, where it used to fetch every replica, and returns exactly what a scan would:
// that volume's replicas in the namespace asked, following creates and deletes.
func TestSelectableFieldsAreIndexed(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns1, ns2 := env.Namespace(t), env.Namespace(t)
	create := func(ns, name, volume string) *storagev1alpha1.CStorVolumeReplica {
		t.Helper()
		r := &storagev1alpha1.CStorVolumeReplica{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       storagev1alpha1.CStorVolumeReplicaSpec{Volume: volume, Pool: "pool-" + name, NodeName: "node-1", Capacity: resource.MustParse("1Mi")},
		}
		if err := env.Client.Create(ctx, r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	create(ns1, "a1", "vol-a")
	a2 := create(ns1, "a2", "vol-a")
	create(ns1, "b1", "vol-b")
	create(ns2, "a3", "vol-a") // the same volume name in another namespace
	for i := range 20 {
		create(ns1, "other-"+string(rune('a'+i)), "vol-other")
	}

	list := func(ns, volume string) []string {
		t.Helper()
		var l storagev1alpha1.CStorVolumeReplicaList
		if err := env.Client.List(ctx, &l, client.InNamespace(ns), client.MatchingFields{storagev1alpha1.FieldVolume: volume}); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, r := range l.Items {
			names = append(names, r.Name)
		}
		slices.Sort(names)
		return names
	}
	fetched := func() (indexed, lists float64) {
		t.Helper()
		raw, err := env.Kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		sum := func(family string) float64 {
			var v float64
			for _, m := range mfs[family].GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["group"] == storagev1alpha1.GroupVersion.Group && labels["resource"] == "cstorvolumereplicas" && labels["index"] == "f:spec.volume" {
					v += m.GetCounter().GetValue()
				}
			}
			return v
		}
		return sum("apiserver_cache_list_fetched_objects_total"), sum("apiserver_cache_list_total")
	}

	beforeFetched, beforeLists := fetched()
	if got := list(ns1, "vol-a"); !slices.Equal(got, []string{"a1", "a2"}) {
		t.Fatalf("replicas of vol-a in %s: %v, want [a1 a2]", ns1, got)
	}
	afterFetched, afterLists := fetched()
	if afterLists != beforeLists+1 {
		t.Fatalf("lists served from the index f:spec.volume: %v more, want 1 (the list was not served from the index)", afterLists-beforeLists)
	}
	// A scan fetches the namespace's 23 replicas; the index, at most vol-a's 3 (2 of them in
	// ns1).
	if n := afterFetched - beforeFetched; n < 2 || n > 3 {
		t.Fatalf("objects fetched for the list: %v, want 2 or 3, the replicas of vol-a, not the 23 of %s", n, ns1)
	}

	if got := list(ns2, "vol-a"); !slices.Equal(got, []string{"a3"}) {
		t.Fatalf("replicas of vol-a in %s: %v, want [a3]", ns2, got)
	}
	if got := list(ns1, "vol-b"); !slices.Equal(got, []string{"b1"}) {
		t.Fatalf("replicas of vol-b in %s: %v, want [b1]", ns1, got)
	}
	if got := list(ns1, "vol-none"); len(got) != 0 {
		t.Fatalf("replicas of vol-none: %v, want none", got)
	}
	if err := env.Client.Delete(ctx, a2); err != nil {
		t.Fatal(err)
	}
	create(ns1, "a4", "vol-a")
	// A consistent list waits for the cache to hold the delete and the create.
	if got := list(ns1, "vol-a"); !slices.Equal(got, []string{"a1", "a4"}) {
		t.Fatalf("replicas of vol-a in %s after deleting a2 and creating a4: %v, want [a1 a4]", ns1, got)
	}
}
