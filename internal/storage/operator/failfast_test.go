package operator_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/testenv"
)

// warningEvent waits for a Warning Event about obj with reason whose message holds want.
func (c *cluster) warningEvent(obj client.Object, reason, want string) {
	c.t.Helper()
	ns := obj.GetNamespace()
	if ns == "" {
		ns = metav1.NamespaceDefault // where Events about cluster-scoped objects go
	}
	testenv.Eventually(c.t, 10*time.Second, fmt.Sprintf("a Warning %s Event on %s", reason, obj.GetName()), func(ctx context.Context) (bool, error) {
		var evs corev1.EventList
		if err := c.c.List(ctx, &evs, client.InNamespace(ns),
			client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.uid", string(obj.GetUID()))}); err != nil {
			return false, err
		}
		var seen []string
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == reason && strings.Contains(e.Message, want) {
				return true, nil
			}
			seen = append(seen, e.Type+"/"+e.Reason+": "+e.Message)
		}
		return false, fmt.Errorf("events: %s", strings.Join(seen, " | "))
	})
}

// A volume no pool could ever hold fails at once with a terminal reason, a message with the
// sizes and a Warning Event, and places nothing — unlike one that waits for more pools or for
// free space, whose messages say which. A claim making larger pools later still serves it.
func TestVolumeNoPoolCouldHold(t *testing.T) {
	c := newCluster(t)
	for i := 1; i <= 3; i++ {
		c.addNode(c.nodeName(i))
		c.startAgent(c.nodeName(i))
	}
	c.startOperator()
	claim := c.createClaim("small", nil) // 1Gi pools
	c.waitPools(claim.Name, 3)
	ctx := context.Background()

	terminal := func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		return ready.Status == metav1.ConditionFalse && conditions.IsTerminal(ready.Reason)
	}
	for _, tc := range []struct {
		name string
		size int64
		want string
	}{
		{name: "too-big", size: 2 << 30, want: "no pool could ever hold a replica of 2Gi: the largest of 3 pools holds 1Gi, and the storage pool claim makes pools of at most 1Gi"},
		// Near the most the CRD admits (less than 8Ei).
		{name: "huge", size: 7 << 60, want: "no pool could ever hold a replica of 7Ei: the largest of 3 pools holds 1Gi"},
	} {
		v := c.createVolume(tc.name, 3, tc.size)
		got := c.waitVolume(tc.name, 20*time.Second, "failed for good", terminal)
		ready := meta.FindStatusCondition(got.Status.Conditions, conditions.TypeReady)
		if ready.Reason != conditions.ReasonInvalidSpec || !strings.Contains(ready.Message, tc.want) {
			t.Errorf("volume %s: Ready %s/%s %q, want InvalidSpec with %q", tc.name, ready.Status, ready.Reason, ready.Message, tc.want)
		}
		if p := meta.FindStatusCondition(got.Status.Conditions, conditions.TypeProgressing); p == nil || p.Status != metav1.ConditionFalse {
			t.Errorf("volume %s still progressing: %+v", tc.name, p)
		}
		c.warningEvent(v, conditions.ReasonInvalidSpec, tc.want)
		if rs, err := c.replicas(ctx, tc.name); err != nil || len(rs) != 0 {
			t.Errorf("volume %s: %d replicas (%v), want none", tc.name, len(rs), err)
		}
	}

	// Large enough pools that are full now: waiting, and saying so.
	c.createVolume("fills", 3, 768*mib)
	c.waitVolume("fills", 20*time.Second, "Healthy", volumeReady)
	c.createVolume("waits", 1, 512*mib)
	c.waitVolume("waits", 20*time.Second, "waiting for free space", func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		return ready.Reason == conditions.ReasonWaiting && ready.Message ==
			"0 of 1 replicas placed; waiting for 1 more pool; no pool has 512Mi free (3 healthy pools large enough without a replica of this volume are too full: the most free space left is 256Mi)"
	})

	// A claim of larger pools: the failed volume is placed with no change to it.
	big := claim.DeepCopy()
	big.ObjectMeta = metav1.ObjectMeta{Name: c.id + "-big"}
	big.Spec.Capacity = resource.MustParse("4Gi")
	if err := c.c.Create(ctx, big); err != nil {
		t.Fatal(err)
	}
	c.waitVolume("too-big", 30*time.Second, "Healthy on the larger pools", volumeReady)
	replicas := c.checkReplicaFiles("too-big", 3, 2<<30)
	for _, r := range replicas {
		var p storagev1alpha1.CStorPool
		if err := c.c.Get(ctx, client.ObjectKey{Name: r.Spec.Pool}, &p); err != nil {
			t.Fatal(err)
		}
		if p.Spec.Claim != big.Name {
			t.Errorf("replica %s on pool %s of claim %s, want one of %s", r.Name, p.Name, p.Spec.Claim, big.Name)
		}
	}
	c.waitVolume("huge", 5*time.Second, "still failed", terminal)
}

// A pool or replica whose name is taken by another claim's pool or another volume's replica
// is an error on the requester, with a Warning Event naming the object — not provisioned.
func TestNameCollision(t *testing.T) {
	c := newCluster(t)
	for i := 1; i <= 2; i++ {
		c.addNode(c.nodeName(i))
		c.startAgent(c.nodeName(i))
	}
	ctx := context.Background()
	claimName := c.id + "-taken"
	// A pool named as the claim's pool on node 2 will be, but of another claim on node 1.
	squat := &storagev1alpha1.CStorPool{
		ObjectMeta: metav1.ObjectMeta{Name: storagev1alpha1.PoolName(claimName, c.nodeName(2))},
		Spec: storagev1alpha1.CStorPoolSpec{NodeName: c.nodeName(1), Claim: c.id + "-other", Capacity: resource.MustParse("1Gi"),
			PoolType: storagev1alpha1.PoolTypeStriped, Backend: storagev1alpha1.BackendFile},
	}
	if err := c.c.Create(ctx, squat); err != nil {
		t.Fatal(err)
	}
	c.startOperator()
	claim := c.createClaim("taken", ptr.To(int32(2)))
	want := fmt.Sprintf("pool name %s for node %s is taken by the pool of claim %s on node %s", squat.Name, c.nodeName(2), squat.Spec.Claim, c.nodeName(1))
	testenv.Eventually(t, 20*time.Second, "claim failed naming the taken pool", func(ctx context.Context) (bool, error) {
		var got storagev1alpha1.StoragePoolClaim
		if err := c.c.Get(ctx, client.ObjectKeyFromObject(claim), &got); err != nil {
			return false, err
		}
		ready := meta.FindStatusCondition(got.Status.Conditions, conditions.TypeReady)
		if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != conditions.ReasonFailed || !strings.Contains(ready.Message, want) ||
			got.Status.ProvisionedPools != 1 {
			return false, fmt.Errorf("status %+v", got.Status)
		}
		return true, nil
	})
	c.warningEvent(claim, conditions.ReasonFailed, want)
	pools := c.waitPools(claim.Name, 1)
	if pools[0].Spec.NodeName != c.nodeName(1) {
		t.Fatalf("the claim's pool is on %s, want %s", pools[0].Spec.NodeName, c.nodeName(1))
	}

	// A replica named as the volume's replica on that pool will be, but of another volume.
	other := &storagev1alpha1.CStorVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: storagev1alpha1.ReplicaName("vol", pools[0].Name)},
		Spec: storagev1alpha1.CStorVolumeReplicaSpec{Volume: "someone-else", Pool: squat.Name, NodeName: c.nodeName(1),
			Capacity: resource.MustParse("1Mi")},
	}
	if err := c.c.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	// The squatting pool is full, so the volume's one replica can only go to the claim's pool.
	filler := &storagev1alpha1.CStorVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "filler"},
		Spec:       storagev1alpha1.CStorVolumeReplicaSpec{Volume: "filler", Pool: squat.Name, NodeName: c.nodeName(1), Capacity: resource.MustParse("1023Mi")},
	}
	if err := c.c.Create(ctx, filler); err != nil {
		t.Fatal(err)
	}
	v := c.createVolume("vol", 1, mib)
	wantReplica := fmt.Sprintf("replica name %s is taken by the replica of volume someone-else on pool %s", other.Name, squat.Name)
	got := c.waitVolume("vol", 20*time.Second, "failed naming the taken replica", func(_ *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		return ready.Reason == conditions.ReasonFailed && strings.Contains(ready.Message, wantReplica)
	})
	if got.Status.ReadyReplicas != 0 || len(got.Status.Replicas) != 0 {
		t.Errorf("the taken replica counts as the volume's: %+v", got.Status)
	}
	c.warningEvent(v, conditions.ReasonFailed, wantReplica)
}

// Pools and replicas named by the scheme before names carried a hash ("<claim>-<node>",
// "<volume>-<pool>") are found by their spec and kept: no second pool for a node, no extra
// replica.
func TestOldNamesAdopted(t *testing.T) {
	c := newCluster(t)
	for i := 1; i <= 2; i++ {
		c.addNode(c.nodeName(i))
		c.startAgent(c.nodeName(i))
	}
	ctx := context.Background()
	claim := c.createClaim("old", nil)
	for i := 1; i <= 2; i++ {
		p := &storagev1alpha1.CStorPool{
			ObjectMeta: metav1.ObjectMeta{Name: claim.Name + "-" + c.nodeName(i), OwnerReferences: []metav1.OwnerReference{{
				APIVersion: storagev1alpha1.GroupVersion.String(), Kind: "StoragePoolClaim", Name: claim.Name, UID: claim.UID, Controller: ptr.To(true),
			}}},
			Spec: storagev1alpha1.CStorPoolSpec{NodeName: c.nodeName(i), Claim: claim.Name, Capacity: claim.Spec.Capacity,
				PoolType: claim.Spec.PoolType, Backend: claim.Spec.Backend},
		}
		if err := c.c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	c.waitPools(claim.Name, 2)
	v := c.createVolume("vol", 2, mib)
	oldPool := claim.Name + "-" + c.nodeName(1)
	r := &storagev1alpha1.CStorVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "vol-" + oldPool, Finalizers: []string{storagev1alpha1.AgentFinalizer},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: storagev1alpha1.GroupVersion.String(), Kind: "CStorVolume", Name: v.Name, UID: v.UID, Controller: ptr.To(true),
			}}},
		Spec: storagev1alpha1.CStorVolumeReplicaSpec{Volume: v.Name, Pool: oldPool, NodeName: c.nodeName(1), Capacity: v.Spec.Capacity},
	}
	if err := c.c.Create(ctx, r); err != nil {
		t.Fatal(err)
	}

	c.startOperator()
	c.waitVolume("vol", 20*time.Second, "Healthy", volumeReady)
	replicas := c.checkReplicaFiles("vol", 2, mib)
	names := map[string]bool{}
	for _, x := range replicas {
		names[x.Name] = true
	}
	if !names[r.Name] {
		t.Errorf("replicas %v: the old-named %s is not among them", names, r.Name)
	}
	testenv.Eventually(t, 10*time.Second, "claim Ready with its 2 old pools", func(ctx context.Context) (bool, error) {
		var got storagev1alpha1.StoragePoolClaim
		if err := c.c.Get(ctx, client.ObjectKeyFromObject(claim), &got); err != nil {
			return false, err
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, conditions.TypeReady) || got.Status.ProvisionedPools != 2 {
			return false, fmt.Errorf("status %+v", got.Status)
		}
		return true, nil
	})
	pools, err := c.pools(ctx, claim.Name)
	if err != nil {
		t.Fatal(err)
	}
	if len(pools) != 2 {
		t.Fatalf("pools %s, want the 2 old-named ones", describePools(pools))
	}
	for _, p := range pools {
		if p.Name != claim.Name+"-"+p.Spec.NodeName {
			t.Errorf("pool %s is not the old-named pool of node %s", p.Name, p.Spec.NodeName)
		}
	}
}
