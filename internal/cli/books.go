package cli

import (
	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/manager"

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
		RunE: func(*cobra.Command, []string) error {
			return runService("books", o, func(mgr manager.Manager) error { return books.Register(mgr, ipc.Options{}) })
		},
	}
	o.flags(cmd)
	return cmd
}
