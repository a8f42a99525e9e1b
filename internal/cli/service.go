package cli

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/crdipc/crdipc/internal/identity"
	"github.com/crdipc/crdipc/internal/services"
)

// newServiceCommand is `crdipc <service>`: exactly one entry of the service table, run by
// the same code as in up, in a process of its own.
func newServiceCommand(e services.Entry) *cobra.Command {
	var s services.Standalone
	svc := e.New()
	cmd := &cobra.Command{
		Use:     e.Name,
		Aliases: e.Aliases,
		Short:   e.Short,
		Long:    e.Long + "\n\nOn a cluster it runs as the ServiceAccount " + identity.ServiceAccount(e.Name) + ", with the role in config/rbac/" + e.Name + ".",
		Example: e.Example,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return services.Run(ctx, e, svc, s)
		},
	}
	if e.Name == "nodes" {
		cmd.Long = e.Long
	}
	s.AddFlags(cmd.Flags(), e)
	svc.AddFlags(cmd.Flags())
	return cmd
}
