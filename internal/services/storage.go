package services

import (
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/crdipc/crdipc/internal/storage/agent"
	"github.com/crdipc/crdipc/internal/storage/operator"
)

func storageOperatorEntry() Entry {
	return Entry{
		Name:    "storage-operator",
		Aliases: []string{"operator"},
		Short:   "Run the storage operator (seed 000): claims → pools, volumes → replicas",
		Long: `storage-operator reconciles the storage.crdipc.io kinds it owns:

  StoragePoolClaim  one CStorPool, named <claim>-<node>-<hash>, per Ready node matching the
                    claim's nodeSelector, up to maxPools; nodes that join later get one.
                    Deleting a claim deletes its empty pools.
  CStorVolume       replicationFactor CStorVolumeReplicas, named <volume>-<pool>-<hash>, on
                    distinct Healthy pools (distinct nodes first, then least used). With
                    fewer pools than replicas it places what fits, reports Waiting
                    ("2 of 3 replicas placed; waiting for 1 more pool") and places the
                    rest when a pool appears. A replica whose node was deleted is
                    replaced on another pool at once, one Offline on a node that still
                    exists after --replace-after; the new replica is rebuilt from a
                    healthy one by its agent (or by the volume's target, where the
                    volume is staged). The last healthy copies are never replaced.

It also creates the storage data path's CA (Secret crdipc-storage-data-ca): the
node agents serve replica data, and volume targets reach it, over mutual TLS under
it.

The pool agents on the nodes (crdipc pool-agent) do the work on disk and report it
in the pools' and replicas' status; operator and agents never call each other.

Run two replicas for availability: leader election lets only one act.`,
		Kind: Controllers,
		New:  func() Service { return &operatorService{} },
	}
}

type operatorService struct{ o operator.Options }

func (s *operatorService) AddFlags(fs *pflag.FlagSet) {
	fs.DurationVar(&s.o.ReplaceAfter, "replace-after", operator.DefaultReplaceAfter, "how long a replica may stay Offline on a node that still exists before it is replaced on another pool")
}

func (s *operatorService) Setup(mgr manager.Manager, env Env) error {
	o := s.o
	o.Receiver.TracerProvider = env.TracerProvider("storage-operator")
	return operator.Register(mgr, o)
}

func poolAgentEntry() Entry {
	return Entry{
		Name:  "pool-agent",
		Short: "Run the pool agent of one node (seed 000's cstor-pool-mgmt)",
		Long: `pool-agent executes, on one node, the pool and replica operations the storage
operator requests through CStorPool and CStorVolumeReplica objects, and reports
the outcome in their status. It lists and watches only the objects whose
spec.nodeName is its node.

With the file backend (the default) a pool is a directory under --root and a
replica a sparse file of its capacity; capacity comes from statfs. Pools of
backend zfs are served when the zpool and zfs commands are installed.

Every operation is idempotent and a pool or replica past Init is never created
again: after a restart the agent adopts what is on disk, and what has vanished is
reported Offline. Deleting a pool or replica destroys its data (its finalizer);
a pool that still holds replicas is not deleted.

While it holds the node's Lease the agent also serves its replicas' data on
--data-addr, over mutual TLS under the storage data CA (Secret
crdipc-storage-data-ca, made by the operator): to the volume targets that write
every replica, and to peers that rebuild from it. A replica that is new on the node
or fell behind its peers while no target writes the volume is rebuilt from the
freshest healthy peer (kubectl get cvr shows Rebuilding and its progress).

/readyz turns ready once the agent holds the node's Lease and every replica of the
node that a volume's target writes has caught up with the writes it missed while no
agent served it (at most --catch-up-timeout): a DaemonSet's rolling update then takes
down the next node's agent only when this node's replicas count toward quorum again.

Before acting the agent takes the node's Lease (pool-agent-<node> in
crdipc-system): a second agent for the same node waits until the first is gone.
On a real cluster, run it as a DaemonSet with --node from the downward API.

In crdipc up, one agent runs for each simulated node, with its pools under
<data-dir>/nodes/<node> and its data service on a loopback address of its own.`,
		Example: `  crdipc pool-agent --node node-1 --root /var/lib/crdipc
  crdipc pool-agent --node "$NODE_NAME" --root /data --resync 30s`,
		// The node Lease, not a leader election of the service, fences the agent.
		Kind: Server,
		New:  func() Service { return &poolAgentService{o: agent.Options{Resync: 10 * time.Second}} },
	}
}

type poolAgentService struct{ o agent.Options }

func (s *poolAgentService) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&s.o.Node, "node", "", "the node this agent serves (default: $NODE_NAME)")
	fs.StringVar(&s.o.Root, "root", "/var/lib/crdipc", "directory for the node's pools")
	fs.StringVar(&s.o.DataAddr, "data-addr", ":9500", "address of the replica data service ('' disables it: nothing can read or rebuild this node's replicas)")
	fs.StringVar(&s.o.LocalSocket, "local-socket", "", "Unix socket on which the replica data service also serves this node's CSI plugin, without TLS, in a directory of its own made 0700 (the plugin's --local-replica-socket; default <root>/local/replica.sock; 'none': not served)")
	fs.StringVar(&s.o.DataAdvertiseHost, "data-advertise-address", "", "address peers dial for --data-addr when it names no host (default: $POD_IP)")
	fs.DurationVar(&s.o.Resync, "resync", s.o.Resync, "how often every pool and replica is checked against the disk")
	fs.StringVar(&s.o.Identity, "identity", "", "name of this agent in the node Lease (default: hostname_uuid)")
	fs.StringVar(&s.o.MetricsAddr, "metrics-bind-address", ":8080", "address for Prometheus /metrics ('0' disables)")
	fs.StringVar(&s.o.HealthAddr, "health-probe-bind-address", ":8081", "address for /healthz and /readyz ('0' disables)")
	fs.DurationVar(&s.o.CatchUpTimeout, "catch-up-timeout", 10*time.Minute, "longest time /readyz waits, after the agent takes the node Lease, for the node's replicas that targets write to be caught up")
}

// In up, the pool agents run under a supervisor that starts one per simulated node. The
// supervisor is the cluster's part, not the agents': it runs as the simulated nodes'
// identity (crdipc-nodes, config/rbac/nodes), which watches Nodes and reports a deleted
// node's pools and replicas Offline:
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorpools;cstorvolumereplicas,verbs=get;list;watch
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorpools/status;cstorvolumereplicas/status,verbs=update

// agentsRoot holds the pool agents' roots in up, one per simulated node: <data-dir>/nodes/<node>.
func agentsRoot(dataDir string) string { return filepath.Join(dataDir, "nodes") }

// LocalReplicaSocket is where node's pool agent in up (with data directory dataDir) serves
// the replicas to the node's CSI plugin (driver.Options.LocalReplicaSocket).
func LocalReplicaSocket(dataDir, node string) string {
	return agent.LocalSocket(filepath.Join(agentsRoot(dataDir), node))
}

func (s *poolAgentService) Setup(mgr manager.Manager, env Env) error {
	o := s.o
	o.TracerProvider = env.TracerProvider("pool-agent")
	if env.Local != nil {
		// One agent per simulated node, each with the node's pools under the data dir.
		root := agentsRoot(env.Local.DataDir)
		o.MetricsAddr, o.HealthAddr = "0", "0"
		// What starts an agent for each node is the cluster's part (a DaemonSet controller
		// and the kubelet): it watches Nodes with the nodes' credentials, on a manager of its
		// own; each agent acts as the pool agent's ServiceAccount.
		infraCfg, err := env.Local.Config("nodes")
		if err != nil {
			return err
		}
		infra, err := NewManager(infraCfg, "pool-agents", ManagerOptions{Repeatable: true, Logger: mgr.GetLogger()})
		if err != nil {
			return err
		}
		so := agent.SupervisorOptions{Root: root, Agent: o}
		if env.Local.NodeConfig != nil {
			// Each agent with a token bound to its node: the node restriction lets it
			// write only that node's pools, replicas and Lease.
			so.Config = func(node string) (*rest.Config, error) {
				cfg, err := env.Local.NodeConfig("pool-agent", node)
				if err != nil {
					return nil, err
				}
				return env.Tracing.RESTConfig(cfg, "pool-agent"), nil
			}
		}
		if _, err := agent.AddSupervisor(infra, env.Config, so); err != nil {
			return err
		}
		if err := mgr.Add(runnableFunc(infra.Start)); err != nil {
			return err
		}
		env.say("nodes    %d simulated, a pool agent each, pools under %s", env.Local.Nodes, root)
		return nil
	}
	if o.Node == "" {
		o.Node = os.Getenv("NODE_NAME")
	}
	if o.Node == "" {
		return errors.New("--node (or $NODE_NAME) is required")
	}
	if err := Absolute(&o.Root); err != nil {
		return err
	}
	if o.DataAdvertiseHost == "" {
		o.DataAdvertiseHost = os.Getenv("POD_IP")
	}
	a, err := agent.New(env.Config, o)
	if err != nil {
		return err
	}
	return mgr.Add(runnableFunc(a.Run))
}
