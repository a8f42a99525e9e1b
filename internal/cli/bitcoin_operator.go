package cli

import (
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/crdipc/crdipc/internal/bitcoin"
)

func newBitcoinOperatorCommand() *cobra.Command {
	var (
		so serviceOptions
		o  bitcoin.Options
	)
	cmd := &cobra.Command{
		Use:   "bitcoin-operator",
		Short: "Run the BitcoinNetwork operator (seed 002)",
		Long: `bitcoin-operator reconciles BitcoinNetworks (bitcoin.crdipc.io): for each it keeps a
StatefulSet of spec.nodes bitcoind pods, a headless Service and (unless spec.secretName
names one) a Secret with generated RPC credentials, all owned by the network. Whenever a
pod becomes ready it introduces it to the other ready nodes over bitcoind's JSON-RPC
(addnode), and reports nodes, readyNodes, peers and Ready=True once every node is ready
and connected to every other.

Run two replicas for availability: leader election lets only one act.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			// Only the networks' pods are cached, not every pod of the cluster.
			req, err := labels.NewRequirement(bitcoin.NetworkLabel, selection.Exists, nil)
			if err != nil {
				return err
			}
			so.cache = cache.Options{ByObject: map[client.Object]cache.ByObject{
				&corev1.Pod{}: {Label: labels.NewSelector().Add(*req)},
			}}
			return runService("bitcoin-operator", so, func(mgr manager.Manager) error { return bitcoin.Add(mgr, o) })
		},
	}
	so.flags(cmd)
	cmd.Flags().DurationVar(&o.RPCTimeout, "rpc-timeout", 0, "timeout of one JSON-RPC call to a node (default 5s)")
	cmd.Flags().DurationVar(&o.Resync, "resync", 0, "how often a Ready network is checked again (default 30s)")
	return cmd
}
