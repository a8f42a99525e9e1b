package cli

import (
	"fmt"
	"net/http"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/scheme"
)

// serviceOptions are the flags every long-running crdipc controller takes.
type serviceOptions struct {
	kubeconfig  string
	leaderElect bool
	metricsAddr string
	healthAddr  string
	// cache narrows what the manager caches (not a flag: set by the service's command).
	cache cache.Options
	// repeatable lets the same controllers be built again in this process (bench, whose
	// tests run it more than once): controller-runtime refuses duplicate controller names,
	// which would report the same metrics.
	repeatable bool
}

func (o *serviceOptions) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
	cmd.Flags().BoolVar(&o.leaderElect, "leader-elect", true, "elect a leader through a Lease in "+install.SystemNamespace+" so only one replica acts")
	cmd.Flags().StringVar(&o.metricsAddr, "metrics-bind-address", ":8080", "address for Prometheus /metrics ('0' disables)")
	cmd.Flags().StringVar(&o.healthAddr, "health-probe-bind-address", ":8081", "address for /healthz and /readyz ('0' disables)")
}

// newManager builds a controller-runtime manager for one service, with
// health checks, metrics and (optionally) leader election.
func newManager(cfg *rest.Config, name string, o serviceOptions) (manager.Manager, error) {
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme.Scheme,
		Cache:                         o.cache,
		Metrics:                       metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress:        o.healthAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              name + ".crdipc.io",
		LeaderElectionNamespace:       install.SystemNamespace,
		LeaderElectionReleaseOnCancel: true,
		Controller:                    config.Controller{SkipNameValidation: ptr.To(o.repeatable)},
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("informers", func(req *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(req.Context()) {
			return fmt.Errorf("informer caches not synced")
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return mgr, nil
}

// runService is the body of every controller subcommand: load the
// kubeconfig, build the service's manager, let register add its
// controllers, and run until SIGINT/SIGTERM.
func runService(name string, o serviceOptions, register func(manager.Manager) error) error {
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	mgr, err := newManager(cfg, name, o)
	if err != nil {
		return err
	}
	if err := register(mgr); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
