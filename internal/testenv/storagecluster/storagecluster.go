package storagecluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/simnode"
	"github.com/crdipc/crdipc/internal/storage/agent"
	"github.com/crdipc/crdipc/internal/storage/operator"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/tracing"
	"github.com/crdipc/crdipc/ipc"
)

// Options configure a storage cluster.
type Options struct {
	// Nodes is how many simulated nodes, node-1 … node-N, to start.
	Nodes int
	// Root holds each node's agent root, Root/<node>; default a t.TempDir().
	Root string
	// Agent is the template of every pool agent. Resync defaults to 300 ms, so tests see
	// what changes on disk quickly.
	Agent agent.Options
	// Tracing, when set, traces the operator (service storage-operator) and the agents
	// (pool-agent), as up does: their reconciles and their API requests.
	Tracing *tracing.Provider
	// Tokens has each agent authenticate with a token bound to its node, as in up, rather
	// than impersonate one (testenv.Env.WithToken).
	Tokens bool
}

// Cluster is a running storage system.
type Cluster struct {
	// Root holds each node's agent root, Root/<node>.
	Root string
	// Supervisor runs the nodes' pool agents.
	Supervisor *agent.Supervisor
}

// LocalReplicaSocket is where node's pool agent serves its replicas to the node's CSI
// plugin (driver.Options.LocalReplicaSocket), as on a real node.
func (c *Cluster) LocalReplicaSocket(node string) string {
	return agent.LocalSocket(filepath.Join(c.Root, node))
}

// Start runs the operator, o.Nodes simulated nodes and their pool agents until the test
// ends, and returns once every node's agent holds its node Lease. At the end, after the
// manager has stopped, the Nodes node-1 … node-N are deleted, so the next test of the
// package starts from none.
func Start(t *testing.T, o Options) *Cluster {
	t.Helper()
	env := testenv.Get(t)
	if o.Root == "" {
		o.Root = t.TempDir()
	}
	if o.Agent.Resync == 0 {
		o.Agent.Resync = 300 * time.Millisecond
	}
	var operatorTP trace.TracerProvider
	if o.Tracing.Enabled() {
		operatorTP, o.Agent.TracerProvider = o.Tracing.Service("storage-operator"), o.Tracing.Service("pool-agent")
	}
	mgr := testenv.NewManager(t, o.Tracing.RESTConfig(env.Config, "storage-operator"))
	if err := operator.Register(mgr, operator.Options{Receiver: ipc.Options{LeaseDuration: -1, TracerProvider: operatorTP}}); err != nil {
		t.Fatal(err)
	}
	if err := simnode.Add(mgr, simnode.Options{Nodes: o.Nodes}); err != nil {
		t.Fatal(err)
	}
	// Each agent as its node's pool agent, as in up: the operator approves the data-path
	// certificate of a token bound to the node only.
	poolAgent := env.AsServiceAccount(t, "pool-agent")
	var tokens *testenv.Tokens
	if o.Tokens {
		tokens = env.Tokens(t)
	}
	sup, err := agent.AddSupervisor(mgr, env.Config, agent.SupervisorOptions{Root: o.Root, Agent: o.Agent,
		Config: func(node string) (*rest.Config, error) {
			cfg := testenv.BoundTo(poolAgent, node)
			if tokens != nil {
				var err error
				if cfg, err = tokens.For(cfg); err != nil {
					return nil, err
				}
			}
			return o.Tracing.RESTConfig(cfg, "pool-agent"), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	// Registered before Start's own cleanup, so it runs after the manager has stopped.
	t.Cleanup(func() {
		for i := 1; i <= o.Nodes; i++ {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: simnode.NodeName(i)}}
			if err := env.Client.Delete(context.Background(), node); client.IgnoreNotFound(err) != nil {
				t.Errorf("deleting simulated node %s: %v", node.Name, err)
			}
		}
	})
	c := &Cluster{Root: o.Root, Supervisor: sup}
	testenv.Start(t, "storage cluster", mgr.Start)
	nodes := make([]string, o.Nodes)
	for i := range nodes {
		nodes[i] = simnode.NodeName(i + 1)
	}
	c.WaitLeading(t, nodes...)
	return c
}

// WaitLeading waits until the agents of nodes run and hold their node Leases, e.g. for a
// simulated Node the test added.
func (c *Cluster) WaitLeading(t testing.TB, nodes ...string) {
	t.Helper()
	testenv.Eventually(t, time.Minute, fmt.Sprintf("the pool agents of %v leading", nodes), func(context.Context) (bool, error) {
		var waiting []string
		for _, n := range nodes {
			if !c.Supervisor.Leading(n) {
				waiting = append(waiting, n)
			}
		}
		if len(waiting) != 0 {
			return false, fmt.Errorf("not yet leading: %v", waiting)
		}
		return true, nil
	})
}

// PoolClaim creates claim and, at the end of the test, deletes it and waits until its pools
// are gone, while the cluster still runs. Left behind, a pool keeps the status its stopped
// agent last wrote (Healthy), and the next test's operator may place replicas on it before
// the new agent finds its data gone and reports it Offline: volumes that never become ready.
// Cleanups run last first, so a test deletes its volumes in a cleanup registered after this
// call (a pool is destroyed only once it holds no replicas).
func (c *Cluster) PoolClaim(t testing.TB, claim *storagev1alpha1.StoragePoolClaim) {
	t.Helper()
	env := testenv.Get(t)
	if err := env.Client.Create(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Client.Delete(context.Background(), claim); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting pool claim %s: %v", claim.Name, err)
		}
		testenv.Eventually(t, time.Minute, fmt.Sprintf("the pools of claim %s gone", claim.Name), func(ctx context.Context) (bool, error) {
			var l storagev1alpha1.CStorPoolList
			if err := env.Client.List(ctx, &l, client.MatchingFields{storagev1alpha1.FieldClaim: claim.Name}); err != nil {
				return false, err
			}
			if len(l.Items) != 0 {
				return false, fmt.Errorf("%d pools left", len(l.Items))
			}
			return true, nil
		})
	})
}

// ServeDriver serves the CSI driver with o (o.Config is whom it acts as) on a Unix socket of
// its own until the test ends, and returns the socket's endpoint, unix://….
func ServeDriver(t *testing.T, o driver.Options) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "csi") // short: a socket path is at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	socket := "unix://" + filepath.Join(dir, "csi.sock")
	d, err := driver.New(o)
	if err != nil {
		t.Fatal(err)
	}
	l, err := driver.Listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "csi driver", func(ctx context.Context) error { return d.ServeListener(ctx, l) })
	return socket
}
