package cli

import (
	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/crdipc/crdipc/internal/books"
	"github.com/crdipc/crdipc/ipc"
)

func newBooksCommand() *cobra.Command {
	var o serviceOptions
	cmd := &cobra.Command{
		Use:   "books",
		Short: "Run the Book controller (seed 002)",
		Long: `books reconciles Books (library.crdipc.io): it checks the ISBN checksum
the schema cannot, and replies in each Book's status with Ready=True
(reason Succeeded) or Ready=False (reason InvalidSpec, terminal), plus an
Event. Finished Books with spec.ttlSecondsAfterFinished are deleted after it.

Run two replicas for availability: leader election lets only one act.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := restConfig(o.kubeconfig)
			if err != nil {
				return err
			}
			mgr, err := newManager(cfg, "books", o)
			if err != nil {
				return err
			}
			if err := books.Register(mgr, ipc.Options{}); err != nil {
				return err
			}
			return mgr.Start(ctrl.SetupSignalHandler())
		},
	}
	o.flags(cmd)
	return cmd
}
