package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/services"
)

func newInstallCommand() *cobra.Command {
	var cluster services.ClusterFlags
	cmd := &cobra.Command{
		Use:   "install",
		Short: "Apply crdipc's CRDs to the cluster in KUBECONFIG and wait until they are served",
		Long: `install applies the CustomResourceDefinitions compiled into this binary
with server-side apply (field manager "crdipc-install"), so running it again
changes nothing and a newer binary updates the schemas. It returns when every
CRD is Established.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := cluster.Config()
			if err != nil {
				return err
			}
			names, err := install.Apply(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			for _, n := range names {
				fmt.Fprintf(cmd.OutOrStdout(), "customresourcedefinition/%s established\n", n)
			}
			return nil
		},
	}
	cluster.AddFlags(cmd.Flags())
	return cmd
}
