package controlplane

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/component-base/configz"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
)

// startControllerManager runs the named kube-controller-manager controllers
// in this process, without leader election (there is one) and without a
// serving port (its health is the API server's concern here).
//
// dataDir takes what the controllers would otherwise write on the host (the attach/detach
// controller's flex-volume plugin directory, under /usr/libexec by default).
func startControllerManager(ctx context.Context, kubeconfig, dataDir string, p pki, controllers []string) (*component, error) {
	registerVersion()
	s, err := options.NewKubeControllerManagerOptions()
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager options: %w", err)
	}
	known, disabled, aliases := app.KnownControllers(), app.ControllersDisabledByDefault(), app.ControllerAliases()
	fs := pflag.NewFlagSet("kube-controller-manager", pflag.ContinueOnError)
	for _, f := range s.Flags(known, disabled, aliases).FlagSets {
		fs.AddFlagSet(f)
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=" + strings.Join(controllers, ","),
		"--leader-elect=false",
		"--secure-port=0",
		"--service-account-private-key-file=" + p.serviceAccountKey,
		"--root-ca-file=" + p.caCert,
		"--flex-volume-plugin-dir=" + filepath.Join(dataDir, "flexvolume"),
		// The CSR signer issues client certificates from the cluster's CA: a node's
		// kubeconfig (crdipc kubeconfig) is a CertificateSigningRequest approved by an admin.
		"--cluster-signing-cert-file=" + p.caCert,
		"--cluster-signing-key-file=" + p.caKey,
		// Each controller acts as its own ServiceAccount with its bootstrap
		// role (system:controller:<name>), as kubeadm clusters run it; the
		// controller manager's own identity may only mint their tokens.
		"--use-service-account-credentials=true",
		// The embedded cluster is small; default worker counts only add goroutines.
		"--concurrent-gc-syncs=5",
		"--concurrent-namespace-syncs=2",
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kube-controller-manager flags: %w", err)
	}
	if err := s.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, fmt.Errorf("kube-controller-manager feature gates: %w", err)
	}
	c, err := s.Config(ctx, known, disabled, aliases)
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager config: %w", err)
	}
	// configz is a process-wide registry; the previous run's entry must go
	// before a restarted controller manager registers its own.
	configz.Delete(app.ConfigzName)
	completed := c.Complete()
	return runComponent("kube-controller-manager", func() error {
		return app.Run(ctx, completed)
	}), nil
}
