package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/crdipc/crdipc/internal/controlplane"
)

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print crdipc's version and the Kubernetes version of its embedded control plane",
		Long: `version prints crdipc's own version (and commit, when the build recorded it)
and the version of Kubernetes that "crdipc up" runs: the k8s.io/kubernetes module
this binary is built from, which is also what its API server reports to clients
(kubectl version, GET /version).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintf(cmd.OutOrStdout(), "crdipc %s\nkubernetes %s\n", version(), controlplane.ServerVersion())
			return nil
		},
	}
}
