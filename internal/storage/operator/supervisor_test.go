package operator_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/simnode"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/storagecluster"
)

// What `crdipc up --nodes 2` runs, driven the way the acceptance drives it with kubectl:
// a claim and a 3-replica volume → 2 of 3; a simulated Node created by hand → 3 of 3;
// the Node deleted → its agent stops and its pool is Offline.
func TestSimulatedNodes(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	// Registered after newCluster's cleanup, so the cluster stops before that purges.
	sc := storagecluster.Start(t, storagecluster.Options{Nodes: 2, Root: c.root})
	t.Cleanup(func() {
		_ = c.c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-3"}})
	})

	claim := &storagev1alpha1.StoragePoolClaim{
		ObjectMeta: metav1.ObjectMeta{Name: c.id + "-sim"},
		Spec: storagev1alpha1.StoragePoolClaimSpec{
			MinPools: 1, Capacity: resource.MustParse("1Gi"), Backend: storagev1alpha1.BackendFile,
			NodeSelector: map[string]string{simnode.Label: "true"},
		},
	}
	if err := c.c.Create(ctx, claim); err != nil {
		t.Fatal(err)
	}
	c.waitPools(claim.Name, 2)
	c.createVolume("vol", 3, 8*mib)
	v := c.waitVolume("vol", 20*time.Second, "with 2 ready replicas", func(v *storagev1alpha1.CStorVolume, _ *metav1.Condition) bool {
		return v.Status.ReadyReplicas == 2
	})
	if msg := meta.FindStatusCondition(v.Status.Conditions, conditions.TypeReady).Message; msg != "2 of 3 replicas placed; waiting for 1 more pool" {
		t.Fatalf("message %q", msg)
	}

	// kubectl apply of a simulated Node: no status, simnode reports it Ready.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-3", Labels: map[string]string{simnode.Label: "true"}}}
	if err := c.c.Create(ctx, node); err != nil {
		t.Fatal(err)
	}
	c.waitVolume("vol", 20*time.Second, "Healthy", volumeReady)
	replicas := c.checkReplicaFiles("vol", 3, 8*mib)
	var onThird *storagev1alpha1.CStorVolumeReplica
	for i := range replicas {
		if replicas[i].Spec.NodeName == "node-3" {
			onThird = &replicas[i]
		}
	}
	if onThird == nil {
		t.Fatal("no replica on node-3")
	}
	// The agent says where the data is: the replica's file under node-3's root.
	if want := filepath.Join(c.root, c.replicaFile(onThird)); onThird.Status.Location != want {
		t.Errorf("replica on node-3: location %q, want %q", onThird.Status.Location, want)
	}
	if _, err := os.Stat(onThird.Status.Location); err != nil {
		t.Fatal(err)
	}

	if err := c.c.Delete(ctx, node); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "node-3's pool Offline, agent stopped", func(ctx context.Context) (bool, error) {
		var p storagev1alpha1.CStorPool
		if err := c.c.Get(ctx, client.ObjectKey{Name: onThird.Spec.Pool}, &p); err != nil {
			return false, err
		}
		if running := sc.Supervisor.Running("node-3"); p.Status.Phase != storagev1alpha1.PoolPhaseOffline || running {
			return false, fmt.Errorf("pool phase %q, agent running=%v", p.Status.Phase, running)
		}
		return true, nil
	})
	c.waitVolume("vol", 20*time.Second, "Degraded with 2 ready replicas", func(v *storagev1alpha1.CStorVolume, _ *metav1.Condition) bool {
		return v.Status.Phase == storagev1alpha1.VolumePhaseDegraded && v.Status.ReadyReplicas == 2
	})

	// Nothing serves node-3 any more: deleting the volume and then the claim must not wait
	// for its agent forever; the operator releases what only that agent could.
	if err := c.c.Delete(ctx, v); err != nil {
		t.Fatal(err)
	}
	if err := c.c.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "volume, claim, pools and files gone", func(ctx context.Context) (bool, error) {
		verr := c.c.Get(ctx, client.ObjectKeyFromObject(v), &storagev1alpha1.CStorVolume{})
		cerr := c.c.Get(ctx, client.ObjectKeyFromObject(claim), &storagev1alpha1.StoragePoolClaim{})
		pools, err := c.pools(ctx, claim.Name)
		if err != nil {
			return false, err
		}
		files := c.replicaFiles()
		// node-3's file stays: its node is gone, nobody can delete it.
		if !isNotFound(verr) || !isNotFound(cerr) || len(pools) != 0 || len(files) != 1 {
			return false, fmt.Errorf("volume: %v, claim: %v, pools: %s, files: %v", verr, cerr, describePools(pools), files)
		}
		return true, nil
	})
}
