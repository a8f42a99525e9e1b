package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/crdipc/crdipc/internal/install"
)

func newInstallCommand() *cobra.Command {
	var kubeconfig string
	cmd := &cobra.Command{
		Use:   "install",
		Short: "Apply crdipc's CRDs to the cluster in KUBECONFIG and wait until they are served",
		Long: `install applies the CustomResourceDefinitions compiled into this binary
with server-side apply (field manager "crdipc-install"), so running it again
changes nothing and a newer binary updates the schemas. It returns when every
CRD is Established.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := restConfig(kubeconfig)
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
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	return cmd
}
