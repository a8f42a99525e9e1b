package operator_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/agent"
	"github.com/crdipc/crdipc/internal/testenv"
)

// A claim gets one Healthy pool, a real directory, per matching node; a node that joins
// gets one too, up to maxPools. Two operators run at once and still make one pool per node.
func TestClaimMakesOnePoolPerNode(t *testing.T) {
	c := newCluster(t)
	for i := 1; i <= 3; i++ {
		c.addNode(c.nodeName(i))
		c.startAgent(c.nodeName(i))
	}
	c.startOperator()
	c.startOperator() // racing: deterministic names make them create the same pools
	claim := c.createClaim("pools", ptr.To(int32(4)))
	pools := c.waitPools(claim.Name, 3)
	for _, p := range pools {
		if want := storagev1alpha1.PoolName(claim.Name, p.Spec.NodeName); p.Name != want {
			t.Errorf("pool %s, want name %s", p.Name, want)
		}
		if _, err := os.Stat(filepath.Join(c.agentRoot(p.Spec.NodeName), "pools", p.Name, ".crdipc-pool.json")); err != nil {
			t.Errorf("pool %s has no directory: %v", p.Name, err)
		}
		if p.Status.Capacity == nil || p.Status.Capacity.Total.String() != "1Gi" {
			t.Errorf("pool %s capacity %+v, want total 1Gi", p.Name, p.Status.Capacity)
		}
	}
	testenv.Eventually(t, 10*time.Second, "claim Ready with 3 of 3 pools healthy", func(ctx context.Context) (bool, error) {
		var got storagev1alpha1.StoragePoolClaim
		if err := c.c.Get(ctx, client.ObjectKeyFromObject(claim), &got); err != nil {
			return false, err
		}
		ready := meta.IsStatusConditionTrue(got.Status.Conditions, conditions.TypeReady)
		if s := got.Status; !ready || s.DesiredPools != 3 || s.ProvisionedPools != 3 || s.HealthyPools != 3 {
			return false, fmt.Errorf("status %+v", s)
		}
		return true, nil
	})

	c.addNode(c.nodeName(4))
	c.startAgent(c.nodeName(4))
	c.waitPools(claim.Name, 4)

	// maxPools is 4: a fifth node gets none.
	c.addNode(c.nodeName(5))
	c.startAgent(c.nodeName(5))
	testenv.Eventually(t, 10*time.Second, "claim sees the fifth node", func(ctx context.Context) (bool, error) {
		var got storagev1alpha1.StoragePoolClaim
		if err := c.c.Get(ctx, client.ObjectKeyFromObject(claim), &got); err != nil {
			return false, err
		}
		if got.Status.DesiredPools != 4 || got.Status.ProvisionedPools != 4 {
			return false, fmt.Errorf("status %+v", got.Status)
		}
		return true, nil
	})
	if pools, _ := c.pools(context.Background(), claim.Name); len(pools) != 4 {
		t.Fatalf("%d pools, want 4: %s", len(pools), describePools(pools))
	}
}

// The seed's core constraint: 3 replicas wanted, 2 nodes — place 2, report Waiting, and
// place the third as soon as a node joins, with no user action.
func TestVolumePlacesThirdReplicaWhenNodeJoins(t *testing.T) {
	c := newCluster(t)
	for i := 1; i <= 2; i++ {
		c.addNode(c.nodeName(i))
		c.startAgent(c.nodeName(i))
	}
	c.startOperator()
	claim := c.createClaim("grow", nil)
	c.waitPools(claim.Name, 2)

	c.createVolume("vol", 3, 4*mib)
	v := c.waitVolume("vol", 20*time.Second, "with 2 ready replicas", func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		return v.Status.ReadyReplicas == 2
	})
	ready := meta.FindStatusCondition(v.Status.Conditions, conditions.TypeReady)
	if v.Status.Phase != storagev1alpha1.VolumePhaseDegraded || ready.Status != metav1.ConditionFalse ||
		ready.Reason != conditions.ReasonWaiting || ready.Message != "2 of 3 replicas placed; waiting for 1 more pool" {
		t.Fatalf("volume with 2 of 3 replicas: phase %s, Ready %s/%s %q", v.Status.Phase, ready.Status, ready.Reason, ready.Message)
	}
	c.checkReplicaFiles("vol", 2, 4*mib)

	c.addNode(c.nodeName(3))
	c.startAgent(c.nodeName(3))
	c.waitVolume("vol", 20*time.Second, "Healthy", volumeReady)
	replicas := c.checkReplicaFiles("vol", 3, 4*mib)
	nodes := map[string]bool{}
	for _, r := range replicas {
		nodes[r.Spec.NodeName] = true
		if r.Name != storagev1alpha1.ReplicaName("vol", r.Spec.Pool) {
			t.Errorf("replica %s on pool %s: name is not <volume>-<pool>", r.Name, r.Spec.Pool)
		}
		if ref := metav1.GetControllerOf(&r); ref == nil || ref.Kind != "CStorVolume" || ref.UID != v.UID {
			t.Errorf("replica %s is not owned by the volume: %v", r.Name, r.OwnerReferences)
		}
	}
	if len(nodes) != 3 {
		t.Fatalf("replicas on %d nodes, want 3 distinct", len(nodes))
	}
}

// checkReplicaFiles checks that the volume has n Healthy replicas, each a sparse file of
// the right size on its node, and returns them.
func (c *cluster) checkReplicaFiles(volume string, n int, size int64) []storagev1alpha1.CStorVolumeReplica {
	c.t.Helper()
	replicas, err := c.replicas(context.Background(), volume)
	if err != nil {
		c.t.Fatal(err)
	}
	if len(replicas) != n {
		c.t.Fatalf("volume %s has %d replicas, want %d", volume, len(replicas), n)
	}
	files := c.replicaFiles()
	for i := range replicas {
		r := &replicas[i]
		if r.Status.Phase != storagev1alpha1.ReplicaPhaseHealthy {
			c.t.Errorf("replica %s is %s", r.Name, r.Status.Phase)
		}
		path := filepath.Join(c.root, c.replicaFile(r))
		fi, err := os.Stat(path)
		if err != nil {
			c.t.Errorf("replica %s: %v", r.Name, err)
			continue
		}
		if fi.Size() != size {
			c.t.Errorf("replica file %s is %d bytes, want %d", path, fi.Size(), size)
		}
		if _, ok := files[c.replicaFile(r)]; !ok {
			c.t.Errorf("replica file %s not found by walking the roots", path)
		}
	}
	return replicas
}

// An agent that is down when a volume is created leaves its replica in Init; started, it
// creates it.
func TestReplicaWaitsInInitForItsAgent(t *testing.T) {
	c := newCluster(t)
	var third *proc
	for i := 1; i <= 3; i++ {
		c.addNode(c.nodeName(i))
		third = c.startAgent(c.nodeName(i))
	}
	c.startOperator()
	claim := c.createClaim("init", nil)
	c.waitPools(claim.Name, 3)
	third.stop()

	c.createVolume("vol", 3, mib)
	c.waitVolume("vol", 20*time.Second, "with 3 replicas, 2 ready", func(v *storagev1alpha1.CStorVolume, _ *metav1.Condition) bool {
		return v.Status.ReadyReplicas == 2 && len(v.Status.Replicas) == 3
	})
	replicas, err := c.replicas(context.Background(), "vol")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range replicas {
		if r.Spec.NodeName != c.nodeName(3) {
			continue
		}
		if r.Status.Phase != "" && r.Status.Phase != storagev1alpha1.ReplicaPhaseInit {
			t.Fatalf("replica %s of the stopped agent is %s", r.Name, r.Status.Phase)
		}
		// Protected from the moment it exists, before its agent has seen it.
		if !slices.Contains(r.Finalizers, storagev1alpha1.AgentFinalizer) {
			t.Errorf("replica %s has finalizers %v, want the agent's from creation", r.Name, r.Finalizers)
		}
		if _, err := os.Stat(filepath.Join(c.root, c.replicaFile(&r))); err == nil {
			t.Fatalf("replica %s has a file although its agent is stopped", r.Name)
		}
	}
	v := c.waitVolume("vol", time.Second, "status", func(*storagev1alpha1.CStorVolume, *metav1.Condition) bool { return true })
	for _, r := range v.Status.Replicas {
		if r.Node == c.nodeName(3) && r.Phase != storagev1alpha1.ReplicaPhaseInit {
			t.Fatalf("volume reports the waiting replica as %s, want Init", r.Phase)
		}
	}

	c.startAgent(c.nodeName(3))
	c.waitVolume("vol", 20*time.Second, "Healthy", volumeReady)
	c.checkReplicaFiles("vol", 3, mib)
}

// Deleting a volume deletes its replicas and their files. A pool that holds replicas
// is not deleted, and says why; once empty it goes, with its directory.
func TestDeletion(t *testing.T) {
	c := newCluster(t)
	for i := 1; i <= 2; i++ {
		c.addNode(c.nodeName(i))
		c.startAgent(c.nodeName(i))
	}
	c.startOperator()
	claim := c.createClaim("del", nil)
	pools := c.waitPools(claim.Name, 2)
	ctx := context.Background()

	v := c.createVolume("gone", 2, mib)
	c.waitVolume("gone", 20*time.Second, "Healthy", volumeReady)
	if n := len(c.replicaFiles()); n != 2 {
		t.Fatalf("%d replica files, want 2", n)
	}
	if err := c.c.Delete(ctx, v); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "replicas and files gone", func(ctx context.Context) (bool, error) {
		replicas, err := c.replicas(ctx, "gone")
		if err != nil {
			return false, err
		}
		if files := c.replicaFiles(); len(replicas) != 0 || len(files) != 0 {
			return false, fmt.Errorf("%d replicas, files %v", len(replicas), files)
		}
		return true, nil
	})

	// A pool holding a replica stays, and its condition names the replica.
	c.createVolume("held", 2, mib)
	c.waitVolume("held", 20*time.Second, "Healthy", volumeReady)
	pool := pools[0]
	if err := c.c.Delete(ctx, &pool); err != nil {
		t.Fatal(err)
	}
	held := storagev1alpha1.ReplicaName("held", pool.Name)
	testenv.Eventually(t, 20*time.Second, "pool deletion held by "+held, func(ctx context.Context) (bool, error) {
		var p storagev1alpha1.CStorPool
		if err := c.c.Get(ctx, client.ObjectKeyFromObject(&pool), &p); err != nil {
			return false, err
		}
		cond := meta.FindStatusCondition(p.Status.Conditions, conditions.TypeReady)
		if cond == nil {
			return false, errors.New("no Ready condition")
		}
		if cond.Reason != conditions.ReasonDeleting || !strings.Contains(cond.Message, held) {
			return false, fmt.Errorf("Ready %s/%s %q", cond.Status, cond.Reason, cond.Message)
		}
		return true, nil
	})
	if _, err := os.Stat(filepath.Join(c.agentRoot(pool.Spec.NodeName), "pools", pool.Name)); err != nil {
		t.Fatalf("held pool's directory: %v", err)
	}
	// A file of our own in the pool directory shows whether the agent destroyed it.
	sentinel := filepath.Join(c.agentRoot(pool.Spec.NodeName), "pools", pool.Name, "sentinel")
	if err := os.WriteFile(sentinel, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.c.Delete(ctx, &storagev1alpha1.CStorVolume{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "held"}}); err != nil {
		t.Fatal(err)
	}
	// Once empty the pool goes, directory and all; the claim then makes a new one for the
	// node (same name, new object), since the node still matches.
	testenv.Eventually(t, 20*time.Second, "emptied pool and its directory gone", func(ctx context.Context) (bool, error) {
		var p storagev1alpha1.CStorPool
		err := c.c.Get(ctx, client.ObjectKeyFromObject(&pool), &p)
		_, statErr := os.Stat(sentinel)
		gone := isNotFound(err) || err == nil && p.UID != pool.UID
		if !gone || !os.IsNotExist(statErr) {
			return false, fmt.Errorf("get: %v (uid %s), sentinel: %v", err, p.UID, statErr)
		}
		return true, nil
	})

	// The claim's own deletion removes its (empty) pools and their directories, then the claim.
	if err := c.c.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "claim and its pools gone", func(ctx context.Context) (bool, error) {
		err := c.c.Get(ctx, client.ObjectKeyFromObject(claim), &storagev1alpha1.StoragePoolClaim{})
		left, lerr := c.pools(ctx, claim.Name)
		if lerr != nil {
			return false, lerr
		}
		var dirs []string
		for _, p := range pools {
			if _, err := os.Stat(filepath.Join(c.agentRoot(p.Spec.NodeName), "pools", p.Name)); err == nil {
				dirs = append(dirs, p.Name)
			}
		}
		if !isNotFound(err) || len(left) != 0 || len(dirs) != 0 {
			return false, fmt.Errorf("claim: %v, pools: %s, dirs: %v", err, describePools(left), dirs)
		}
		return true, nil
	})
}

// Status is the truth: a replica file removed behind the agent's back turns the replica
// Offline and the volume Degraded; so does a pool directory.
func TestStatusFollowsTheDisk(t *testing.T) {
	c := newCluster(t)
	for i := 1; i <= 3; i++ {
		c.addNode(c.nodeName(i))
		c.startAgent(c.nodeName(i))
	}
	c.startOperator()
	claim := c.createClaim("truth", nil)
	c.waitPools(claim.Name, 3)
	c.createVolume("vol", 3, mib)
	c.waitVolume("vol", 20*time.Second, "Healthy", volumeReady)
	replicas, err := c.replicas(context.Background(), "vol")
	if err != nil {
		t.Fatal(err)
	}
	victim := replicas[0]
	if err := os.Remove(filepath.Join(c.root, c.replicaFile(&victim))); err != nil {
		t.Fatal(err)
	}
	v := c.waitVolume("vol", 10*time.Second, "Degraded", func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		return v.Status.Phase == storagev1alpha1.VolumePhaseDegraded && ready.Reason == conditions.ReasonDegraded
	})
	ready := meta.FindStatusCondition(v.Status.Conditions, conditions.TypeReady)
	if !strings.Contains(ready.Message, victim.Name+" is Offline") || v.Status.ReadyReplicas != 2 {
		t.Fatalf("volume: %d ready, message %q", v.Status.ReadyReplicas, ready.Message)
	}
	var r storagev1alpha1.CStorVolumeReplica
	if err := c.c.Get(context.Background(), client.ObjectKeyFromObject(&victim), &r); err != nil {
		t.Fatal(err)
	}
	cond := meta.FindStatusCondition(r.Status.Conditions, conditions.TypeReady)
	if r.Status.Phase != storagev1alpha1.ReplicaPhaseOffline || cond == nil || !strings.Contains(cond.Message, "not re-creating") {
		t.Fatalf("replica: %s, %+v", r.Status.Phase, cond)
	}
	if _, err := os.Stat(filepath.Join(c.root, c.replicaFile(&victim))); err == nil {
		t.Fatal("the agent re-created the replica file")
	}

	// A pool directory removed: the pool and its replica go Offline; below the
	// consistency factor (2 of 3), the volume is Offline.
	other := replicas[1]
	if err := os.RemoveAll(filepath.Join(c.agentRoot(other.Spec.NodeName), "pools", other.Spec.Pool)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "pool "+other.Spec.Pool+" Offline", func(ctx context.Context) (bool, error) {
		var p storagev1alpha1.CStorPool
		if err := c.c.Get(ctx, client.ObjectKey{Name: other.Spec.Pool}, &p); err != nil {
			return false, err
		}
		if p.Status.Phase != storagev1alpha1.PoolPhaseOffline {
			return false, fmt.Errorf("phase %q", p.Status.Phase)
		}
		return true, nil
	})
	c.waitVolume("vol", 10*time.Second, "Offline with 1 ready replica", func(v *storagev1alpha1.CStorVolume, _ *metav1.Condition) bool {
		return v.Status.Phase == storagev1alpha1.VolumePhaseOffline && v.Status.ReadyReplicas == 1
	})
}

// Two agents for one node: only the holder of the node Lease acts; when it stops, the
// other takes over — and, finding no pool in its own root, reports the pool Offline
// rather than re-creating it.
func TestTwoAgentsForOneNode(t *testing.T) {
	c := newCluster(t)
	node := c.nodeName(1)
	c.addNode(node)
	first := c.startAgent(node)
	testenv.Eventually(t, 10*time.Second, "first agent leads", func(context.Context) (bool, error) {
		return first.agent.Leading(), nil
	})
	secondRoot := filepath.Join(c.root, "second")
	second := c.startAgent(node, func(o *agent.Options) { o.Root = filepath.Join(secondRoot, node) })
	c.startOperator()
	claim := c.createClaim("fence", nil)
	pools := c.waitPools(claim.Name, 1)
	c.createVolume("vol", 1, mib)
	c.waitVolume("vol", 20*time.Second, "Healthy", volumeReady)

	if second.agent.Leading() {
		t.Fatal("both agents lead")
	}
	if _, err := os.Stat(filepath.Join(c.agentRoot(node), "pools", pools[0].Name)); err != nil {
		t.Fatalf("the leading agent's pool: %v", err)
	}
	if entries, err := os.ReadDir(secondRoot); err == nil && len(entries) > 0 {
		t.Fatalf("the standby agent wrote to its root: %v", entries)
	}

	first.stop()
	testenv.Eventually(t, 10*time.Second, "second agent takes over, reporting the pool Offline", func(ctx context.Context) (bool, error) {
		var p storagev1alpha1.CStorPool
		if err := c.c.Get(ctx, client.ObjectKeyFromObject(&pools[0]), &p); err != nil {
			return false, err
		}
		if leading := second.agent.Leading(); !leading || p.Status.Phase != storagev1alpha1.PoolPhaseOffline {
			return false, fmt.Errorf("second agent leading=%v, pool phase %q", leading, p.Status.Phase)
		}
		return true, nil
	})
	if _, err := os.Stat(filepath.Join(secondRoot, node, "pools", pools[0].Name)); err == nil {
		t.Fatal("the second agent re-created a pool past Init")
	}
}
