package operator

import (
	"math"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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

// The waiting message tells pools too small for good from pools too full now, and says
// nothing more than "waiting for N more pools" when no pool is refused for its space.
func TestShortfallTellsTooSmallFromTooFull(t *testing.T) {
	a, b, c := pool("a", "n1", storagev1alpha1.PoolPhaseHealthy), pool("b", "n2", storagev1alpha1.PoolPhaseHealthy), pool("c", "n3", storagev1alpha1.PoolPhaseOffline)
	small := pool("s", "n4", storagev1alpha1.PoolPhaseHealthy)
	small.Spec.Capacity = resource.MustParse("2Gi")
	pools := []storagev1alpha1.CStorPool{a, b, c}
	if got := shortfall(pools, nil, map[string]int64{}, 4*gi); got != "" {
		t.Errorf("4Gi on two empty 10Gi pools: %q, want nothing to say", got)
	}
	if got := shortfall(pools, []storagev1alpha1.CStorVolumeReplica{replicaOn(a), replicaOn(b)}, map[string]int64{}, 4*gi); got != "" {
		t.Errorf("4Gi, the only other pool Offline: %q, want nothing to say", got)
	}
	got := shortfall(pools, []storagev1alpha1.CStorVolumeReplica{replicaOn(a)}, map[string]int64{"b": 8 * gi}, 4*gi)
	if want := "no pool has 4Gi free (1 healthy pool large enough without a replica of this volume is too full: the most free space left is 2Gi)"; got != want {
		t.Errorf("4Gi with b 8Gi used: %q, want %q", got, want)
	}
	got = shortfall(append(pools, small), []storagev1alpha1.CStorVolumeReplica{replicaOn(a)}, map[string]int64{"b": 8 * gi}, 4*gi)
	if want := "no pool has 4Gi free (1 healthy pool large enough without a replica of this volume is too full: the most free space left is 2Gi); " +
		"1 pool without a replica of this volume is smaller than 4Gi (the largest holds 2Gi)"; got != want {
		t.Errorf("4Gi with b full and s small: %q, want %q", got, want)
	}
	huge := int64(7) << 60 // 7Ei, near the most an int64 holds
	got = shortfall(pools, nil, map[string]int64{"a": math.MaxInt64}, huge)
	if want := "3 pools without a replica of this volume are smaller than 7Ei (the largest holds 10Gi)"; got != want {
		t.Errorf("7Ei: %q, want %q", got, want)
	}
}

// A volume no pool could ever hold — no pool large enough in total, and no claim making
// pools large enough when nodes join — is told apart from one that waits for pools.
func TestNeverFits(t *testing.T) {
	pools := []storagev1alpha1.CStorPool{pool("a", "n1", storagev1alpha1.PoolPhaseHealthy), pool("b", "n2", storagev1alpha1.PoolPhaseOffline)}
	gone := pool("big", "n3", storagev1alpha1.PoolPhaseHealthy)
	gone.Spec.Capacity = resource.MustParse("1Ti")
	gone.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	claim := func(capacity string) storagev1alpha1.StoragePoolClaim {
		return storagev1alpha1.StoragePoolClaim{Spec: storagev1alpha1.StoragePoolClaimSpec{Capacity: resource.MustParse(capacity)}}
	}
	maxInt := int64(math.MaxInt64) // a 16Ei request, clamped
	for _, tc := range []struct {
		name   string
		pools  []storagev1alpha1.CStorPool
		claims []storagev1alpha1.StoragePoolClaim
		size   int64
		want   string
	}{
		{name: "a pool large enough, full or not", pools: pools, claims: []storagev1alpha1.StoragePoolClaim{claim("10Gi")}, size: 10 * gi},
		{name: "an Offline pool large enough may come back", pools: pools[1:], size: 10 * gi},
		{name: "no pool large enough, but a claim's new pools would be", pools: pools, claims: []storagev1alpha1.StoragePoolClaim{claim("10Gi"), claim("1Ti")}, size: 20 * gi},
		{name: "nothing known yet", size: maxInt},
		{name: "every pool and claim too small", pools: append(pools, gone), claims: []storagev1alpha1.StoragePoolClaim{claim("10Gi"), claim("5Gi")}, size: maxInt,
			want: "no pool could ever hold a replica of 9223372036854775807: the largest of 2 pools holds 10Gi, and the 2 storage pool claims make pools of at most 10Gi; " +
				"a larger volume needs a StoragePoolClaim with a larger capacity"},
		{name: "a claim without pools yet", claims: []storagev1alpha1.StoragePoolClaim{claim("1Gi")}, size: 2 * gi,
			want: "no pool could ever hold a replica of 2Gi: there is no pool yet, and the storage pool claim makes pools of at most 1Gi; " +
				"a larger volume needs a StoragePoolClaim with a larger capacity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := neverFits(tc.pools, tc.claims, tc.size); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// Byte arithmetic saturates instead of wrapping around: a pool whose replicas add up past
// the largest int64 is full, not empty.
func TestUsageSaturates(t *testing.T) {
	if got := addBytes(math.MaxInt64-1, 7<<60); got != math.MaxInt64 {
		t.Fatalf("addBytes = %d", got)
	}
	p := pool("a", "n1", storagev1alpha1.PoolPhaseHealthy)
	used := map[string]int64{"a": addBytes(7<<60, 7<<60)}
	if picks := choosePools([]storagev1alpha1.CStorPool{p}, nil, used, gi, 1); len(picks) != 0 {
		t.Fatalf("an overfull pool was picked: %v", names(picks))
	}
}

// A pool on a node that is not Ready still says Healthy (its agent went down with the node):
// a replica placed there would only be Offline, and the replacement of a lost replica must
// never go back to the lost node's pool.
func TestPlaceableOnlyOnReadyNodes(t *testing.T) {
	node := func(name string, ready corev1.ConditionStatus) corev1.Node {
		n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if ready != "" {
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}
		}
		return n
	}
	pools := []storagev1alpha1.CStorPool{
		pool("a", "node-a", storagev1alpha1.PoolPhaseHealthy),
		pool("b", "node-b", storagev1alpha1.PoolPhaseHealthy), // its node lost: Unknown
		pool("c", "node-c", storagev1alpha1.PoolPhaseHealthy), // its node NotReady
		pool("d", "node-d", storagev1alpha1.PoolPhaseHealthy), // its node gone
		pool("e", "node-e", storagev1alpha1.PoolPhaseHealthy), // its node never reported
	}
	v := newPlacement(pools, []corev1.Node{
		node("node-a", corev1.ConditionTrue), node("node-b", corev1.ConditionUnknown),
		node("node-c", corev1.ConditionFalse), node("node-e", ""),
	})
	var got []string
	for _, p := range v.placeable(pools) {
		got = append(got, p.Name)
	}
	if !slices.Equal(got, []string{"a"}) {
		t.Errorf("placeable pools %v, want [a]", got)
	}
}
