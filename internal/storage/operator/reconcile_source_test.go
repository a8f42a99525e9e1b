package operator_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/agent"
	"github.com/crdipc/crdipc/internal/testenv"
)

// A volume restored from a snapshot is placed only once the snapshot is ready to use and no
// larger than the volume; its first replicas name the snapshot as their source, and an agent
// that finds no copy to fill from says so instead of passing an empty replica for a restored
// one.
func TestVolumeFromSnapshotWaitsForIt(t *testing.T) {
	c := newCluster(t)
	withData := func(o *agent.Options) { o.DataAddr = "127.0.0.1:0" } // filling is the data service's
	for i := 1; i <= 2; i++ {
		c.addNode(c.nodeName(i))
		c.startAgent(c.nodeName(i), withData)
	}
	c.startOperator()
	claim := c.createClaim("restore", nil)
	c.waitPools(claim.Name, 2)

	v := &storagev1alpha1.CStorVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "restored"},
		Spec: storagev1alpha1.CStorVolumeSpec{Capacity: resource.MustParse("8Mi"), ReplicationFactor: 2,
			Source: &storagev1alpha1.VolumeSource{Snapshot: "snap"}},
	}
	if err := c.c.Create(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	c.waitVolume("restored", 20*time.Second, "waiting for its snapshot", func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		return ready.Message == "waiting for snapshot snap, the volume's source, to exist"
	})

	snap := &storagev1alpha1.CStorVolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "snap"},
		Spec:       storagev1alpha1.CStorVolumeSnapshotSpec{Volume: "gone"},
	}
	if err := c.c.Create(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	c.waitVolume("restored", 20*time.Second, "waiting for its snapshot to be ready", func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		return ready.Message == "waiting for snapshot snap, the volume's source, to be ready to use"
	})
	if rs := mustReplicas(t, c, "restored"); len(rs) != 0 {
		t.Fatalf("replicas placed before the snapshot is ready: %d", len(rs))
	}

	// Ready: placed, each replica to be filled from it; the copy it names is nowhere.
	snap.Status = storagev1alpha1.CStorVolumeSnapshotStatus{ReadyToUse: true, Size: resource.NewQuantity(4*mib, resource.BinarySI),
		Copies: []storagev1alpha1.SnapshotCopy{{Replica: "gone-replica", Node: c.nodeName(1)}}}
	if err := c.c.Status().Update(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "replicas naming the snapshot, unfilled", func(ctx context.Context) (bool, error) {
		rs, err := c.replicas(ctx, "restored")
		if err != nil {
			return false, err
		}
		if len(rs) != 2 {
			return false, fmt.Errorf("%d replicas", len(rs))
		}
		for _, r := range rs {
			ready := meta.FindStatusCondition(r.Status.Conditions, conditions.TypeReady)
			if r.Spec.Source == nil || r.Spec.Source.Snapshot != "snap" || ready == nil ||
				!strings.HasPrefix(ready.Message, "no copy of snapshot snap reachable to fill the replica from: gone-replica: ") {
				return false, fmt.Errorf("replica %s: source %v, phase %s, Ready %v", r.Name, r.Spec.Source, r.Status.Phase, ready)
			}
		}
		return true, nil
	})
	got := &storagev1alpha1.CStorVolume{}
	if err := c.c.Get(context.Background(), client.ObjectKey{Namespace: c.ns, Name: "restored"}, got); err != nil {
		t.Fatal(err)
	}
	if ready := meta.FindStatusCondition(got.Status.Conditions, conditions.TypeReady); ready == nil || ready.Status == metav1.ConditionTrue {
		t.Fatalf("a volume whose replicas hold nothing of its snapshot is Ready: %v", ready)
	}

	// A volume smaller than the snapshot: refused for good, nothing placed.
	small := &storagev1alpha1.CStorVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "small"},
		Spec: storagev1alpha1.CStorVolumeSpec{Capacity: resource.MustParse("2Mi"), ReplicationFactor: 2,
			Source: &storagev1alpha1.VolumeSource{Snapshot: "snap"}},
	}
	if err := c.c.Create(context.Background(), small); err != nil {
		t.Fatal(err)
	}
	c.waitVolume("small", 20*time.Second, "refusing a larger snapshot", func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		return ready.Reason == conditions.ReasonInvalidSpec &&
			ready.Message == "snapshot snap is 4Mi, larger than the volume (2Mi): a restore needs at least the snapshot's size"
	})
	if rs := mustReplicas(t, c, "small"); len(rs) != 0 {
		t.Fatalf("replicas placed for a volume smaller than its snapshot: %d", len(rs))
	}
}
