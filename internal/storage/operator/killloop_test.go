package operator_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/testenv"
)

// Kill the operator or an agent at a random write — before the write reaches the API server,
// or after it was applied but before the writer learns so — while volumes are created and
// deleted, then restart it. After every trial each volume converges with exactly three
// replicas on three nodes, every deleted volume is gone with its replicas, there is one
// pool per node, and the files on disk are exactly the replicas'.
//
// STORAGE_KILL_SEED and STORAGE_KILL_TRIALS reproduce or lengthen a run.
func TestKillAnyComponentAtAnyWrite(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("STORAGE_KILL_SEED"), 10, 64); err == nil {
		seed = s
	}
	trials := 24
	if n, err := strconv.Atoi(os.Getenv("STORAGE_KILL_TRIALS")); err == nil {
		trials = n
	}
	t.Logf("seed %d (STORAGE_KILL_SEED=%d reproduces the choices)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	c := newCluster(t)
	agents := map[string]*proc{}
	nodes := []string{c.nodeName(1), c.nodeName(2), c.nodeName(3)}
	for _, n := range nodes {
		c.addNode(n)
		agents[n] = c.startAgent(n)
	}
	op := c.startOperator()
	claim := c.createClaim("chaos", nil)
	c.waitPools(claim.Name, 3)

	// settle waits for cond, failing at once when the system breaks an invariant.
	settle := func(what string, cond func(ctx context.Context) (bool, error)) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, what, func(ctx context.Context) (bool, error) {
			done, err := cond(ctx)
			if errors.Is(err, errBroken) {
				t.Fatalf("%s: %v", what, err)
			}
			return done, err
		})
	}

	live := map[string]int64{}
	var deleted []string
	kills := map[string]int{}
	for i := range trials {
		// The operator writes ~8 times per volume, an agent ~2 per replica.
		victim, which, writes := op, "operator", 6
		if k := rng.IntN(4); k > 0 {
			which, writes = nodes[k-1], 3
			victim = agents[which]
		}
		at, after := 1+rng.IntN(writes), rng.IntN(2) == 1
		victim.kill.arm(at, after)

		name := fmt.Sprintf("v%d", i)
		capacity := int64(1+rng.IntN(4)) * mib
		c.createVolume(name, 3, capacity)
		live[name] = capacity
		if i%3 == 2 {
			names := make([]string, 0, len(live))
			for n := range live {
				if n != name {
					names = append(names, n)
				}
			}
			slices.Sort(names)
			gone := names[rng.IntN(len(names))]
			v := &storagev1alpha1.CStorVolume{}
			v.Namespace, v.Name = c.ns, gone
			if err := c.c.Delete(context.Background(), v); err != nil {
				t.Fatal(err)
			}
			delete(live, gone)
			deleted = append(deleted, gone)
		}

		settle(fmt.Sprintf("trial %d: %s killed or all converged", i, which), func(ctx context.Context) (bool, error) {
			if victim.stopped() {
				return true, nil
			}
			return c.converged(ctx, claim.Name, live, deleted)
		})
		how := "idle"
		if victim.kill.fired.Load() {
			how = fmt.Sprintf("at write %d, %s", at, map[bool]string{false: "before it", true: "after it"}[after])
		}
		victim.stop()
		kills[how]++
		t.Logf("trial %d: killed %s %s", i, which, how)
		if which == "operator" {
			op = c.startOperator()
		} else {
			agents[which] = c.startAgent(which)
		}
		settle(fmt.Sprintf("trial %d: converged after restarting %s", i, which), func(ctx context.Context) (bool, error) {
			return c.converged(ctx, claim.Name, live, deleted)
		})
	}
	t.Logf("kills: %v", kills)
}

// errBroken marks what converged finds that nothing would ever repair.
var errBroken = errors.New("broken")

// converged reports whether the system has reached the state the trials asked for, and if
// not, what is still pending. A duplicate pool or replica, or a file of the wrong size, is
// an error wrapping errBroken: nothing would ever remove it.
func (c *cluster) converged(ctx context.Context, claim string, live map[string]int64, deleted []string) (bool, error) {
	pools, err := c.pools(ctx, claim)
	if err != nil {
		return false, err
	}
	perNode := map[string]int{}
	for _, p := range pools {
		perNode[p.Spec.NodeName]++
		if perNode[p.Spec.NodeName] > 1 {
			return false, fmt.Errorf("%w: two pools on node %s: %s", errBroken, p.Spec.NodeName, describePools(pools))
		}
	}
	var list storagev1alpha1.CStorVolumeReplicaList
	if err := c.c.List(ctx, &list, client.InNamespace(c.ns)); err != nil {
		return false, err
	}
	byVolume := map[string][]storagev1alpha1.CStorVolumeReplica{}
	for _, r := range list.Items {
		byVolume[r.Spec.Volume] = append(byVolume[r.Spec.Volume], r)
	}
	var pending []string
	for name := range live {
		rs := byVolume[name]
		if len(rs) > 3 {
			return false, fmt.Errorf("%w: volume %s has %d replicas", errBroken, name, len(rs))
		}
		nodes := map[string]bool{}
		for _, r := range rs {
			nodes[r.Spec.NodeName] = true
			if r.Status.Phase != storagev1alpha1.ReplicaPhaseHealthy {
				pending = append(pending, fmt.Sprintf("%s is %q", r.Name, r.Status.Phase))
			}
		}
		if len(rs) == 3 && len(nodes) != 3 {
			return false, fmt.Errorf("%w: volume %s has replicas on %d nodes", errBroken, name, len(nodes))
		}
		var v storagev1alpha1.CStorVolume
		if err := c.c.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: name}, &v); err != nil {
			return false, err
		}
		ready := meta.FindStatusCondition(v.Status.Conditions, conditions.TypeReady)
		if len(rs) != 3 || ready == nil || ready.Status != "True" || v.Status.ObservedGeneration < v.Generation || v.Status.ReadyReplicas != 3 {
			pending = append(pending, fmt.Sprintf("%s: %d replicas, ready %d, %v", name, len(rs), v.Status.ReadyReplicas, ready))
		}
	}
	for _, name := range deleted {
		if n := len(byVolume[name]); n > 0 {
			pending = append(pending, fmt.Sprintf("deleted %s still has %d replicas", name, n))
		}
		err := c.c.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: name}, &storagev1alpha1.CStorVolume{})
		if !isNotFound(err) {
			pending = append(pending, fmt.Sprintf("deleted %s still exists (%v)", name, err))
		}
	}
	// The files on disk are exactly the replicas of live volumes, with their sizes.
	want := map[string]int64{}
	for name, capacity := range live {
		for _, r := range byVolume[name] {
			want[c.replicaFile(&r)] = capacity
		}
	}
	files := c.replicaFiles()
	for f, size := range files {
		if size < 0 {
			pending = append(pending, "temporary file: "+f)
		} else if w, ok := want[f]; !ok {
			pending = append(pending, "file without replica: "+f)
		} else if w != size {
			return false, fmt.Errorf("%w: replica file %s has %d bytes, want %d", errBroken, f, size, w)
		}
	}
	for f := range want {
		if _, ok := files[f]; !ok {
			pending = append(pending, "no file for "+f)
		}
	}
	if len(pending) > 0 {
		slices.Sort(pending)
		return false, errors.New(strings.Join(pending, "; "))
	}
	return true, nil
}
