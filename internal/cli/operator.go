package cli

import (
	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/crdipc/crdipc/internal/storage/operator"
)

func newOperatorCommand() *cobra.Command {
	var o serviceOptions
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
                    rest when a pool appears.

The pool agents on the nodes (crdipc pool-agent) do the work on disk and report it
in the pools' and replicas' status; operator and agents never call each other.

Run two replicas for availability: leader election lets only one act.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return runService("storage-operator", o, func(mgr manager.Manager) error { return operator.Register(mgr, operator.Options{}) })
		},
	}
	o.flags(cmd)
	return cmd
}
