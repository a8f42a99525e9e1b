package operator_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/operator"
	"github.com/crdipc/crdipc/internal/testenv"
)

// A replica on a node that stays NotReady past the grace period, and one on a node that is
// deleted, are replaced on the free node with no user action; the first one's data is
// deleted by its agent once the node is back.
func TestLostReplicasAreReplaced(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	agents := map[string]*proc{}
	for i := 1; i <= 4; i++ {
		c.addNode(c.nodeName(i))
		agents[c.nodeName(i)] = c.startAgent(c.nodeName(i))
	}
	const grace = 2 * time.Second
	c.startOperator(func(o *operator.Options) { o.ReplaceAfter = grace })
	claim := c.createClaim("replace", nil)
	c.waitPools(claim.Name, 4)
	c.createVolume("vol", 3, 4*mib) // on 3 of the 4 nodes
	v := c.waitVolume("vol", 20*time.Second, "Healthy", volumeReady)
	nodesOf := func(v *storagev1alpha1.CStorVolume) map[string]bool {
		m := map[string]bool{}
		for _, r := range v.Status.Replicas {
			m[r.Node] = true
		}
		return m
	}

	// A node goes NotReady (its agent with it): Degraded at once, replaced after the grace.
	down := v.Status.Replicas[0].Node
	agents[down].stop()
	setNodeReady(t, c, down, corev1.ConditionFalse)
	went := time.Now()
	c.waitVolume("vol", 10*time.Second, "Degraded with 2 ready replicas", func(v *storagev1alpha1.CStorVolume, _ *metav1.Condition) bool {
		return v.Status.Phase == storagev1alpha1.VolumePhaseDegraded && v.Status.ReadyReplicas == 2
	})
	v = c.waitVolume("vol", 20*time.Second, "Healthy without a replica on "+down, func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		return volumeReady(v, ready) && !nodesOf(v)[down]
	})
	// Transition times are stored in whole seconds: the grace may end up to 1 s early.
	if took := time.Since(went); took < grace-time.Second {
		t.Fatalf("replica on NotReady %s replaced after %v, before the grace period %v", down, took, grace)
	}
	// The old replica waits, deleting, for its agent: its data is on the node.
	var old storagev1alpha1.CStorVolumeReplica
	oldKey := client.ObjectKey{Namespace: c.ns, Name: storagev1alpha1.ReplicaName("vol", storagev1alpha1.PoolName(claim.Name, down))}
	if err := c.c.Get(ctx, oldKey, &old); err != nil || old.DeletionTimestamp.IsZero() {
		t.Fatalf("replica on %s: %v, deletion %v; want it deleting", down, err, old.DeletionTimestamp)
	}
	setNodeReady(t, c, down, corev1.ConditionTrue)
	agents[down] = c.startAgent(down)
	testenv.Eventually(t, 20*time.Second, "the replaced replica gone once its agent is back", func(ctx context.Context) (bool, error) {
		err := c.c.Get(ctx, oldKey, &old)
		if isNotFound(err) {
			return true, nil
		}
		if err == nil {
			err = fmt.Errorf("replica %s still exists, phase %q", old.Name, old.Status.Phase)
		}
		return false, err
	})

	// A node is deleted: its replica is replaced at once, on the node that is free again.
	gone := ""
	for n := range nodesOf(v) {
		gone = n
	}
	agents[gone].stop()
	if err := c.c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: gone}}); err != nil {
		t.Fatal(err)
	}
	v = c.waitVolume("vol", 20*time.Second, "Healthy with a replica on "+down+", none on "+gone, func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		return volumeReady(v, ready) && !nodesOf(v)[gone] && nodesOf(v)[down]
	})
}

// setNodeReady sets node's Ready condition, as the node lifecycle controller would.
func setNodeReady(t *testing.T, c *cluster, node string, s corev1.ConditionStatus) {
	t.Helper()
	var n corev1.Node
	if err := c.c.Get(context.Background(), client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: s, Reason: "Test", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if err := c.c.Status().Update(context.Background(), &n); err != nil {
		t.Fatal(err)
	}
}

// A replica placed on a pool whose agent then finds the pool's data gone (the pool's status
// was the one its previous agent left) is never created there; it holds no data, so it is
// replaced on another pool at once, not left waiting for an agent that will never serve it.
func TestStillbornReplicaIsReplaced(t *testing.T) {
	c := newCluster(t)
	for i := 1; i <= 2; i++ {
		c.addNode(c.nodeName(i))
	}
	c.startAgent(c.nodeName(1))
	lost := c.startAgent(c.nodeName(2))
	// A grace no test waits out: only the stillborn rule may replace the replica.
	c.startOperator(func(o *operator.Options) { o.ReplaceAfter = time.Hour })
	claim := c.createClaim("stillborn", nil)
	c.waitPools(claim.Name, 2)

	// node-2's agent stops with its pool Healthy; a volume is placed on both pools.
	lost.stop()
	c.createVolume("vol", 2, 4*mib)
	c.waitVolume("vol", 20*time.Second, "1 of 2 replicas healthy", func(v *storagev1alpha1.CStorVolume, _ *metav1.Condition) bool {
		return v.Status.ReadyReplicas == 1 && len(v.Status.Replicas) == 2
	})
	// Its data gone, node-2's new agent reports the pool Offline; the replica never made
	// there is deleted, and with no third pool the volume says so.
	if err := os.RemoveAll(c.agentRoot(c.nodeName(2))); err != nil {
		t.Fatal(err)
	}
	c.startAgent(c.nodeName(2))
	c.waitVolume("vol", 20*time.Second, "waiting for a pool instead of node-2's agent", func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		return len(v.Status.Replicas) == 1 && ready != nil && strings.Contains(ready.Message, "1 of 2 replicas placed")
	})
	// A third node's pool takes the replacement.
	c.addNode(c.nodeName(3))
	c.startAgent(c.nodeName(3))
	c.waitVolume("vol", 30*time.Second, "Healthy on node-1 and node-3", func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		nodes := map[string]bool{}
		for _, r := range v.Status.Replicas {
			nodes[r.Node] = true
		}
		return volumeReady(v, ready) && nodes[c.nodeName(1)] && nodes[c.nodeName(3)]
	})
}
