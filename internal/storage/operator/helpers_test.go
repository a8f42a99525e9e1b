package operator_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/agent"
	"github.com/crdipc/crdipc/internal/storage/operator"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/wait"
	"github.com/crdipc/crdipc/ipc"
)

func TestMain(m *testing.M) {
	testenv.Main(m)
}

// testLabel marks the Nodes of one test; each test's claims select only its own nodes.
const testLabel = "test.crdipc.io/cluster"

const mib = 1 << 20

var clusterSeq atomic.Int32

// cluster is one test's storage system: nodes, agents and operator against the shared API
// server. Tests do not run in parallel: replicas may land on any Healthy pool, so each test
// must leave none behind, which cleanup makes sure of.
type cluster struct {
	t      *testing.T
	env    *testenv.Env
	c      client.WithWatch
	id     string
	root   string
	ns     string
	mu     sync.Mutex
	agents map[string]*proc
	// ops are every operator started, each stopped at cleanup: a test may run two at once.
	ops []*proc
}

// proc is a running agent or operator; stop cancels it (a kill) and waits until it is gone.
type proc struct {
	cancel context.CancelFunc
	done   chan struct{}
	kill   *killer
	agent  *agent.Agent
}

func (p *proc) stop() {
	p.cancel()
	<-p.done
}

func (p *proc) stopped() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	env := testenv.Get(t)
	c := &cluster{
		t: t, env: env, c: env.Client,
		id:     fmt.Sprintf("c%d", clusterSeq.Add(1)),
		root:   t.TempDir(),
		ns:     env.Namespace(t),
		agents: map[string]*proc{},
	}
	t.Cleanup(c.cleanup)
	return c
}

func (c *cluster) nodeName(i int) string { return fmt.Sprintf("%s-node-%d", c.id, i) }

func (c *cluster) agentRoot(node string) string { return filepath.Join(c.root, node) }

// addNode creates a Ready Node of this cluster.
func (c *cluster) addNode(name string) {
	c.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{testLabel: c.id}}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Test", LastHeartbeatTime: metav1.Now()}}
	if err := c.c.Create(context.Background(), n); err != nil {
		c.t.Fatalf("creating node %s: %v", name, err)
	}
}

type agentOption func(*agent.Options)

// startAgent runs an agent for node with its own root.
func (c *cluster) startAgent(node string, opts ...agentOption) *proc {
	c.t.Helper()
	k := &killer{}
	o := agent.Options{
		Node:          node,
		Root:          c.agentRoot(node),
		Resync:        300 * time.Millisecond,
		LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 100 * time.Millisecond,
	}
	for _, f := range opts {
		f(&o)
	}
	// As the node's pool agent: the operator approves its data-path certificate request
	// only from a token bound to the node.
	a, err := agent.New(k.wrap(c.env.AsPoolAgent(c.t, node)), o)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &proc{cancel: cancel, done: make(chan struct{}), kill: k, agent: a}
	k.cancel = cancel
	go func() {
		defer close(p.done)
		if err := a.Run(ctx); err != nil {
			c.t.Errorf("agent %s: %v", node, err)
		}
	}()
	c.mu.Lock()
	c.agents[node+"/"+o.Root] = p
	c.mu.Unlock()
	return p
}

// startOperator runs an operator on its own manager.
func (c *cluster) startOperator(opts ...func(*operator.Options)) *proc {
	c.t.Helper()
	k := &killer{}
	mgr := c.newManager(k.wrap(c.env.Config))
	o := operator.Options{Receiver: ipc.Options{LeaseDuration: -1}}
	for _, f := range opts {
		f(&o)
	}
	if err := operator.Register(mgr, o); err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	p := &proc{cancel: cancel, done: make(chan struct{}), kill: k}
	go func() {
		defer close(p.done)
		if err := mgr.Start(ctx); err != nil {
			c.t.Errorf("operator: %v", err)
		}
	}()
	c.mu.Lock()
	c.ops = append(c.ops, p)
	c.mu.Unlock()
	return p
}

func (c *cluster) newManager(cfg *rest.Config) manager.Manager {
	c.t.Helper()
	return testenv.NewManager(c.t, cfg)
}

// cleanup stops every process and removes every storage object, finalizers and all.
func (c *cluster) cleanup() {
	c.mu.Lock()
	procs := append([]*proc{}, c.ops...)
	for _, p := range c.agents {
		procs = append(procs, p)
	}
	c.mu.Unlock()
	for _, p := range procs {
		p.stop()
	}
	ctx := context.Background()
	purge := func(list client.ObjectList) {
		if err := c.c.List(ctx, list); err != nil {
			c.t.Logf("cleanup: %v", err)
			return
		}
		_ = meta.EachListItem(list, func(o runtime.Object) error {
			obj := o.(client.Object)
			if len(obj.GetFinalizers()) > 0 {
				_ = c.c.Patch(ctx, obj, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`)))
			}
			_ = c.c.Delete(ctx, obj)
			return nil
		})
	}
	purge(&storagev1alpha1.CStorVolumeList{})
	purge(&storagev1alpha1.CStorVolumeReplicaList{})
	purge(&storagev1alpha1.StoragePoolClaimList{})
	purge(&storagev1alpha1.CStorPoolList{})
	purge(&storagev1alpha1.VolumeBackupList{})
	purge(&storagev1alpha1.BackupStoreList{})
	_ = c.c.DeleteAllOf(ctx, &corev1.Node{}, client.MatchingLabels{testLabel: c.id})
	// The next test must not see this one's pools or replicas.
	err := wait.Until(ctx, 20*time.Second, func(ctx context.Context) (bool, error) {
		var pools storagev1alpha1.CStorPoolList
		var replicas storagev1alpha1.CStorVolumeReplicaList
		if err := c.c.List(ctx, &pools); err != nil {
			return false, err
		}
		if err := c.c.List(ctx, &replicas); err != nil {
			return false, err
		}
		if len(pools.Items) != 0 || len(replicas.Items) != 0 {
			return false, fmt.Errorf("%d pools, %d replicas", len(pools.Items), len(replicas.Items))
		}
		return true, nil
	})
	if err != nil {
		c.t.Errorf("cleanup: storage objects remain: %v", err)
	}
}

func (c *cluster) createClaim(name string, maxPools *int32) *storagev1alpha1.StoragePoolClaim {
	c.t.Helper()
	claim := &storagev1alpha1.StoragePoolClaim{
		ObjectMeta: metav1.ObjectMeta{Name: c.id + "-" + name},
		Spec: storagev1alpha1.StoragePoolClaimSpec{
			PoolType: storagev1alpha1.PoolTypeStriped, Backend: storagev1alpha1.BackendFile,
			MinPools: 1, MaxPools: maxPools,
			NodeSelector: map[string]string{testLabel: c.id},
			Capacity:     resource.MustParse("1Gi"),
		},
	}
	if err := c.c.Create(context.Background(), claim); err != nil {
		c.t.Fatalf("creating claim: %v", err)
	}
	return claim
}

func (c *cluster) createVolume(name string, rf int32, capacity int64) *storagev1alpha1.CStorVolume {
	c.t.Helper()
	v := &storagev1alpha1.CStorVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: name},
		Spec:       storagev1alpha1.CStorVolumeSpec{Capacity: *resource.NewQuantity(capacity, resource.BinarySI), ReplicationFactor: rf},
	}
	if err := c.c.Create(context.Background(), v); err != nil {
		c.t.Fatalf("creating volume %s: %v", name, err)
	}
	return v
}

func (c *cluster) pools(ctx context.Context, claim string) ([]storagev1alpha1.CStorPool, error) {
	var list storagev1alpha1.CStorPoolList
	err := c.c.List(ctx, &list, client.MatchingFields{storagev1alpha1.FieldClaim: claim})
	return list.Items, err
}

func (c *cluster) replicas(ctx context.Context, volume string) ([]storagev1alpha1.CStorVolumeReplica, error) {
	var list storagev1alpha1.CStorVolumeReplicaList
	err := c.c.List(ctx, &list, client.InNamespace(c.ns), client.MatchingFields{storagev1alpha1.FieldVolume: volume})
	return list.Items, err
}

// waitPools waits until claim has n Healthy pools.
func (c *cluster) waitPools(claim string, n int) []storagev1alpha1.CStorPool {
	c.t.Helper()
	var pools []storagev1alpha1.CStorPool
	testenv.Eventually(c.t, 30*time.Second, fmt.Sprintf("%d healthy pools of %s", n, claim), func(ctx context.Context) (bool, error) {
		var err error
		if pools, err = c.pools(ctx, claim); err != nil {
			return false, err
		}
		healthy := 0
		for _, p := range pools {
			if p.Status.Phase == storagev1alpha1.PoolPhaseHealthy {
				healthy++
			}
		}
		if healthy != n || len(pools) != n {
			return false, fmt.Errorf("%d pools: %s", len(pools), describePools(pools))
		}
		return true, nil
	})
	return pools
}

func describePools(pools []storagev1alpha1.CStorPool) string {
	var s []string
	for _, p := range pools {
		s = append(s, fmt.Sprintf("%s(%s)=%s", p.Name, p.Spec.NodeName, p.Status.Phase))
	}
	return strings.Join(s, " ")
}

// waitVolume waits until the volume's status, once it reflects the current spec,
// satisfies ok; what says what ok looks for.
func (c *cluster) waitVolume(name string, timeout time.Duration, what string, ok func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool) *storagev1alpha1.CStorVolume {
	c.t.Helper()
	v := &storagev1alpha1.CStorVolume{}
	testenv.Eventually(c.t, timeout, "volume "+name+" "+what, func(ctx context.Context) (bool, error) {
		if err := c.c.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: name}, v); err != nil {
			return false, err
		}
		ready := meta.FindStatusCondition(v.Status.Conditions, conditions.TypeReady)
		state := fmt.Sprintf("phase=%s ready=%d/%d replicas=%v", v.Status.Phase, v.Status.ReadyReplicas, v.Status.DesiredReplicas, v.Status.Replicas)
		if ready != nil {
			state += fmt.Sprintf(" Ready=%s/%s %q", ready.Status, ready.Reason, ready.Message)
		}
		if v.Status.ObservedGeneration < v.Generation || ready == nil || ready.ObservedGeneration < v.Generation {
			return false, fmt.Errorf("status not yet of generation %d: %s", v.Generation, state)
		}
		if !ok(v, ready) {
			return false, errors.New(state)
		}
		return true, nil
	})
	return v
}

func volumeReady(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
	return ready.Status == metav1.ConditionTrue && v.Status.Phase == storagev1alpha1.VolumePhaseHealthy
}

// replicaFiles lists the replica files on every node root of the cluster, relative to it,
// with the temporary files of creates under way (or interrupted) as size -1.
func (c *cluster) replicaFiles() map[string]int64 {
	c.t.Helper()
	files := map[string]int64{}
	err := filepath.WalkDir(c.root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(c.root, path)
		if strings.Contains(d.Name(), ".tmp-") {
			files[rel] = -1
			return nil
		}
		if !strings.HasSuffix(d.Name(), ".img") {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		files[rel] = fi.Size()
		return nil
	})
	if err != nil {
		c.t.Fatal(err)
	}
	return files
}

// replicaFile is where the replica's file is, relative to the cluster root.
func (c *cluster) replicaFile(r *storagev1alpha1.CStorVolumeReplica) string {
	return filepath.Join(r.Spec.NodeName, "pools", r.Spec.Pool, r.Namespace, r.Name+".img")
}

// killer injects a crash into one process: it cancels the process's context at its n-th
// write to the storage API, either before the write reaches the server or after the
// server applied it but before the process learns so.
type killer struct {
	mu     sync.Mutex
	writes int
	at     int // 0: disarmed
	after  bool
	fired  atomic.Bool
	cancel context.CancelFunc
}

func (k *killer) arm(at int, after bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.writes, k.at, k.after = 0, at, after
}

// hit counts a write and reports whether it is the one to die at.
func (k *killer) hit() (kill, after bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.at == 0 {
		return false, false
	}
	k.writes++
	if k.writes != k.at {
		return false, false
	}
	k.at = 0
	return true, k.after
}

func (k *killer) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodGet || !strings.Contains(req.URL.Path, "/apis/"+storagev1alpha1.GroupVersion.Group+"/") {
				return rt.RoundTrip(req)
			}
			kill, after := k.hit()
			if !kill {
				return rt.RoundTrip(req)
			}
			k.fired.Store(true)
			if after {
				if resp, err := rt.RoundTrip(req); err == nil {
					resp.Body.Close()
				}
			}
			k.cancel()
			return nil, errors.New("killed by test")
		})
	})
	return cfg
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// isNotFound is apierrors.IsNotFound for wait conditions.
func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
