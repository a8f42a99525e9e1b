package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/crdipc/crdipc/internal/clientcert"
	"github.com/crdipc/crdipc/internal/safefile"
	"github.com/crdipc/crdipc/internal/services"
)

func newKubeconfigCommand() *cobra.Command {
	var (
		cluster  services.ClusterFlags
		node     string
		user     string
		groups   []string
		server   string
		out      string
		duration time.Duration
	)
	cmd := &cobra.Command{
		Use:   "kubeconfig (--node NAME | --user NAME [--group G]...) -o FILE",
		Short: "Write a kubeconfig for a node's kubelet or another client, with a certificate issued through a CertificateSigningRequest",
		Long: `kubeconfig issues a client certificate through the cluster's API and writes a
kubeconfig that uses it, with the cluster's CA and the certificate embedded, so the
file can be copied to a node as it is.

As the user of --kubeconfig (an admin: it approves the request), it creates a key
and a CertificateSigningRequest for the identity, approves it, and waits until the
control plane's signer (kube-controller-manager's CSR signing controller, which
crdipc up runs) issues the certificate into the request's status:

  --node NAME     the kubelet of node NAME: user system:node:NAME, group
                  system:nodes (signer kubernetes.io/kube-apiserver-client-kubelet).
                  The Node authorizer and NodeRestriction admission confine it to
                  its own Node, its pods and what they use.
  --user NAME     any other client (signer kubernetes.io/kube-apiserver-client),
                  e.g. system:kube-proxy, which crdipc up binds to the role
                  system:node-proxier.

The private key never leaves this machine but in the file written (mode 0600).
See docs/deploy.md for joining a real node to crdipc up.`,
		Example: `  crdipc kubeconfig --node real-1 -o real-1.kubeconfig
  crdipc kubeconfig --user system:kube-proxy -o kube-proxy.kubeconfig
  crdipc kubeconfig --node real-1 --server https://10.88.0.1:6443 -o real-1.kubeconfig`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var req clientcert.Request
			switch {
			case node != "" && user != "":
				return fmt.Errorf("--node and --user: give one")
			case node != "":
				if len(groups) != 0 {
					return fmt.Errorf("--group: a node's groups are fixed (system:nodes)")
				}
				req = clientcert.NodeRequest(node)
			case user != "":
				req = clientcert.Request{User: user, Groups: groups}
			default:
				return fmt.Errorf("--node or --user is required")
			}
			if out == "" {
				return fmt.Errorf("-o FILE is required")
			}
			req.Duration = duration
			cfg, err := cluster.Config()
			if err != nil {
				return err
			}
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			issued, err := clientcert.Issue(ctx, client, req)
			if err != nil {
				return err
			}
			data, err := clientcert.Kubeconfig(cfg, server, issued)
			if err != nil {
				return err
			}
			if err := safefile.Write(out, data, 0o600); err != nil {
				return fmt.Errorf("writing %s: %w", out, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %s (%s, certificatesigningrequest/%s, signer %s)\n", out, req.User, strings.Join(req.Groups, ","), issued.Name, issued.SignerName)
			return nil
		},
	}
	cluster.AddFlags(cmd.Flags())
	cmd.Flags().StringVar(&node, "node", "", "issue the identity of this node's kubelet (system:node:NAME, group system:nodes)")
	cmd.Flags().StringVar(&user, "user", "", "issue this user's identity (the certificate's common name)")
	cmd.Flags().StringSliceVar(&groups, "group", nil, "a group of --user (the certificate's organizations); repeatable")
	cmd.Flags().StringVar(&server, "server", "", "the API server address written into the kubeconfig (default: --kubeconfig's); a node must be able to reach it")
	cmd.Flags().StringVarP(&out, "output", "o", "", "the kubeconfig file to write (mode 0600)")
	cmd.Flags().DurationVar(&duration, "duration", 0, "how long the certificate is valid (default: the signer's, a year)")
	return cmd
}
