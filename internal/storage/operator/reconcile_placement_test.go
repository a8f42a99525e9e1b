package operator

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

func pool(name, node string, phase storagev1alpha1.PoolPhase) storagev1alpha1.CStorPool {
	return storagev1alpha1.CStorPool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       storagev1alpha1.CStorPoolSpec{NodeName: node, Capacity: resource.MustParse("10Gi")},
		Status:     storagev1alpha1.CStorPoolStatus{Phase: phase},
	}
}

func replicaOn(p storagev1alpha1.CStorPool) storagev1alpha1.CStorVolumeReplica {
	return storagev1alpha1.CStorVolumeReplica{Spec: storagev1alpha1.CStorVolumeReplicaSpec{Pool: p.Name, NodeName: p.Spec.NodeName}}
}

func names(ps []*storagev1alpha1.CStorPool) []string {
	var n []string
	for _, p := range ps {
		n = append(n, p.Name)
	}
	return n
}

const gi = int64(1) << 30

func TestChoosePools(t *testing.T) {
	healthy := storagev1alpha1.PoolPhaseHealthy
	deleting := pool("a-n4", "n4", healthy)
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	pools := []storagev1alpha1.CStorPool{
		pool("a-n1", "n1", healthy), pool("b-n1", "n1", healthy),
		pool("a-n2", "n2", healthy), pool("a-n3", "n3", storagev1alpha1.PoolPhaseInit),
		deleting, pool("b-n5", "n5", healthy),
	}
	for _, tc := range []struct {
		name string
		have []storagev1alpha1.CStorVolumeReplica
		used map[string]int64
		size int64
		need int
		want []string
	}{
		{name: "distinct nodes first, then by name", need: 3, size: gi, used: map[string]int64{},
			want: []string{"a-n1", "a-n2", "b-n5"}},
		{name: "least used among distinct nodes", need: 1, size: gi, used: map[string]int64{"a-n1": 5 * gi, "a-n2": 2 * gi, "b-n5": 3 * gi, "b-n1": 0},
			have: []storagev1alpha1.CStorVolumeReplica{replicaOn(pools[5])}, want: []string{"b-n1"}},
		{name: "a node already used comes last", need: 2, size: gi, used: map[string]int64{},
			have: []storagev1alpha1.CStorVolumeReplica{replicaOn(pools[0]), replicaOn(pools[2])}, want: []string{"b-n5", "b-n1"}},
		{name: "not Healthy, deleting or full pools are skipped", need: 5, size: 6 * gi, used: map[string]int64{"a-n1": 5 * gi},
			want: []string{"a-n2", "b-n1", "b-n5"}},
		{name: "fewer pools than needed: what fits", need: 3, size: gi, used: map[string]int64{},
			have: []storagev1alpha1.CStorVolumeReplica{replicaOn(pools[0]), replicaOn(pools[1]), replicaOn(pools[2])}, want: []string{"b-n5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := names(choosePools(pools, tc.have, tc.used, tc.size, tc.need))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// A volume no pool can hold says so, instead of only "waiting for N more pools".
func TestShortfallNamesPoolsTooSmall(t *testing.T) {
	a, b, c := pool("a", "n1", storagev1alpha1.PoolPhaseHealthy), pool("b", "n2", storagev1alpha1.PoolPhaseHealthy), pool("c", "n3", storagev1alpha1.PoolPhaseOffline)
	pools := []storagev1alpha1.CStorPool{a, b, c}
	gi := int64(1 << 30)
	if got := shortfall(pools, nil, map[string]int64{}, 4*gi); got != "" {
		t.Errorf("4Gi on two empty 10Gi pools: %q, want nothing to say", got)
	}
	got := shortfall(pools, []storagev1alpha1.CStorVolumeReplica{replicaOn(a)}, map[string]int64{"b": 8 * gi}, 4*gi)
	if want := "1 healthy pool without a replica of this volume cannot hold 4Gi (the most free space left is 2Gi)"; got != want {
		t.Errorf("4Gi with b 8Gi used: %q, want %q", got, want)
	}
	huge := int64(7) << 60 // 7Ei, near the most an int64 holds
	got = shortfall(pools, nil, map[string]int64{}, huge)
	if want := "2 healthy pools without a replica of this volume cannot hold 7Ei (the most free space left is 10Gi)"; got != want {
		t.Errorf("7Ei: %q, want %q", got, want)
	}
}
