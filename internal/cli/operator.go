package cli

import (
	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/crdipc/crdipc/internal/storage/operator"
)

func newOperatorCommand() *cobra.Command {
	var (
		o  serviceOptions
		oo operator.Options
	)
	cmd := &cobra.Command{
		Use:   "operator",
		Short: "Run the storage operator (seed 000): claims → pools, volumes → replicas",
		Long: `operator reconciles the storage.crdipc.io kinds it owns:

  StoragePoolClaim  one CStorPool, named <claim>-<node>, per Ready node matching the
                    claim's nodeSelector, up to maxPools; nodes that join later get one.
                    Deleting a claim deletes its empty pools.
  CStorVolume       replicationFactor CStorVolumeReplicas, named <volume>-<pool>, on
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
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return runService("storage-operator", o, func(mgr manager.Manager) error { return operator.Register(mgr, oo) })
		},
	}
	o.flags(cmd)
	cmd.Flags().DurationVar(&oo.ReplaceAfter, "replace-after", operator.DefaultReplaceAfter, "how long a replica may stay Offline on a node that still exists before it is replaced on another pool")
	return cmd
}
