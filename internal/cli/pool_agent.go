package cli

import (
	"errors"
	"os"
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/crdipc/crdipc/internal/storage/agent"
)

func newPoolAgentCommand() *cobra.Command {
	var (
		kubeconfig string
		o          = agent.Options{Resync: 10 * time.Second}
	)
	cmd := &cobra.Command{
		Use:   "pool-agent --node NODE",
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

Before acting the agent takes the node's Lease (pool-agent-<node> in
crdipc-system): a second agent for the same node waits until the first is gone.
On a real cluster, run it as a DaemonSet with --node from the downward API.`,
		Example: `  crdipc pool-agent --node node-1 --root /var/lib/crdipc
  crdipc pool-agent --node "$NODE_NAME" --root /data --resync 30s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Node == "" {
				o.Node = os.Getenv("NODE_NAME")
			}
			if o.Node == "" {
				return errors.New("--node (or $NODE_NAME) is required")
			}
			if err := absolute(&o.Root); err != nil {
				return err
			}
			if o.DataAdvertiseHost == "" {
				o.DataAdvertiseHost = os.Getenv("POD_IP")
			}
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return err
			}
			a, err := agent.New(cfg, o)
			if err != nil {
				return err
			}
			return a.Run(ctrl.SetupSignalHandler())
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
	cmd.Flags().StringVar(&o.Node, "node", "", "the node this agent serves (default: $NODE_NAME)")
	cmd.Flags().StringVar(&o.Root, "root", "/var/lib/crdipc", "directory for the node's pools")
	cmd.Flags().StringVar(&o.DataAddr, "data-addr", ":9500", "address of the replica data service ('' disables it: nothing can read or rebuild this node's replicas)")
	cmd.Flags().StringVar(&o.DataAdvertiseHost, "data-advertise-address", "", "address peers dial for --data-addr when it names no host (default: $POD_IP)")
	cmd.Flags().DurationVar(&o.Resync, "resync", o.Resync, "how often every pool and replica is checked against the disk")
	cmd.Flags().StringVar(&o.Identity, "identity", "", "name of this agent in the node Lease (default: hostname_uuid)")
	cmd.Flags().StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", "address for Prometheus /metrics ('0' disables)")
	cmd.Flags().StringVar(&o.HealthAddr, "health-probe-bind-address", ":8081", "address for /healthz and /readyz ('0' disables)")
	return cmd
}
