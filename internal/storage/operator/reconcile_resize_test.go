package operator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// A volume's capacity grows: the operator raises every replica's, the agents grow the
// files, and the volume is Resizing until the last replica has, then Ready at the new size.
// Shrinking is refused by the API server, and growth a pool cannot hold leaves every
// replica as it was.
func TestVolumeGrows(t *testing.T) {
	c := newCluster(t)
	agents := map[string]*proc{}
	for i := 1; i <= 2; i++ {
		c.addNode(c.nodeName(i))
		agents[c.nodeName(i)] = c.startAgent(c.nodeName(i))
	}
	c.startOperator()
	claim := c.createClaim("resize", nil) // pools of 1Gi
	c.waitPools(claim.Name, 2)
	c.createVolume("vol", 2, 4*mib)
	v := c.waitVolume("vol", 20*time.Second, "Healthy", volumeReady)
	if v.Status.Capacity == nil || v.Status.Capacity.Value() != 4*mib {
		t.Fatalf("status.capacity of a Ready 4Mi volume: %v", v.Status.Capacity)
	}

	// With one agent down its replica cannot grow: the volume says how far the growth got.
	down := c.checkReplicaFiles("vol", 2, 4*mib)[1].Spec.NodeName
	agents[down].stop()
	setCapacity(t, c, "vol", "8Mi")
	v = c.waitVolume("vol", 20*time.Second, "Resizing with one replica grown", func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		return ready.Status == metav1.ConditionFalse && ready.Reason == storagev1alpha1.ReasonResizing &&
			ready.Message == "growing to 8Mi: 1 of 2 replicas grown"
	})
	if v.Status.Phase != storagev1alpha1.VolumePhaseHealthy || v.Status.Capacity.Value() != 4*mib {
		t.Errorf("a volume growing still serves its old size: phase %s, status.capacity %v", v.Status.Phase, v.Status.Capacity)
	}
	for _, r := range mustReplicas(t, c, "vol") {
		if r.Spec.Capacity.Value() != 8*mib {
			t.Errorf("replica %s asks for %s, want 8Mi", r.Name, r.Spec.Capacity.String())
		}
	}

	agents[down] = c.startAgent(down)
	v = c.waitVolume("vol", 20*time.Second, "Ready at 8Mi", func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		return volumeReady(v, ready) && v.Status.Capacity != nil && v.Status.Capacity.Value() == 8*mib
	})
	c.checkReplicaFiles("vol", 2, 8*mib)

	// Shrinking: refused at the API server, with the reason.
	err := trySetCapacity(c, "vol", "4Mi")
	if err == nil || !strings.Contains(err.Error(), "capacity may grow but not shrink") {
		t.Fatalf("shrinking a volume: %v, want the API server to refuse it", err)
	}

	// More than the 1Gi pools hold: nothing grows, the volume says which pools are short.
	setCapacity(t, c, "vol", "2Gi")
	v = c.waitVolume("vol", 20*time.Second, "refusing to grow", func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		return ready.Reason == storagev1alpha1.ReasonInsufficientCapacity
	})
	if msg := meta.FindStatusCondition(v.Status.Conditions, conditions.TypeReady).Message; !strings.HasPrefix(msg, "cannot grow to 2Gi: pool ") || !strings.Contains(msg, "needs 2040Mi more") {
		t.Errorf("Ready message of a growth no pool holds: %q", msg)
	}
	for _, r := range mustReplicas(t, c, "vol") {
		if r.Spec.Capacity.Value() != 8*mib {
			t.Errorf("replica %s asks for %s after a refused growth, want 8Mi", r.Name, r.Spec.Capacity.String())
		}
	}
	c.checkReplicaFiles("vol", 2, 8*mib)
}

func mustReplicas(t *testing.T, c *cluster, volume string) []storagev1alpha1.CStorVolumeReplica {
	t.Helper()
	rs, err := c.replicas(context.Background(), volume)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func setCapacity(t *testing.T, c *cluster, name, capacity string) {
	t.Helper()
	if err := trySetCapacity(c, name, capacity); err != nil {
		t.Fatalf("setting the capacity of %s to %s: %v", name, capacity, err)
	}
}

func trySetCapacity(c *cluster, name, capacity string) error {
	v := &storagev1alpha1.CStorVolume{}
	if err := c.c.Get(context.Background(), client.ObjectKey{Namespace: c.ns, Name: name}, v); err != nil {
		return err
	}
	base := v.DeepCopy()
	v.Spec.Capacity = resource.MustParse(capacity)
	return c.c.Patch(context.Background(), v, client.MergeFrom(base))
}
