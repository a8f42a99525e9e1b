package services

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/crdipc/crdipc/internal/cpushare"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/tracing"
)

// ClusterFlags say which cluster a command talks to: the one --kubeconfig of every command.
type ClusterFlags struct {
	Kubeconfig string
}

// AddFlags adds --kubeconfig.
func (c *ClusterFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
}

// Config loads the client config the way kubectl does: the flag, then $KUBECONFIG, then
// ~/.kube/config, then in-cluster.
func (c *ClusterFlags) Config() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = c.Kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	Unthrottle(cfg)
	return cfg, nil
}

// Unthrottle lifts client-go's default 5 QPS: our services issue bursts of small writes,
// which it would throttle long before the API server is busy.
func Unthrottle(cfg *rest.Config) { cfg.QPS, cfg.Burst = -1, 1000 }

// ManagerOptions configure the manager a service runs on.
type ManagerOptions struct {
	LeaderElect bool
	// MetricsAddr serves /metrics and HealthAddr /healthz and /readyz; "0" disables.
	MetricsAddr, HealthAddr string
	// Cache narrows what the manager caches (set by the service, not a flag).
	Cache cache.Options
	// Repeatable lets the same controllers be built again in this process (up's services,
	// bench and tests build them more than once): controller-runtime refuses duplicate
	// controller names, which would report the same metrics.
	Repeatable bool
	Logger     logr.Logger
}

// AddFlags adds the flags of a Controllers entry's manager.
func (o *ManagerOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.LeaderElect, "leader-elect", true, "elect a leader through a Lease in "+install.SystemNamespace+" so only one replica acts")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", "address for Prometheus /metrics ('0' disables)")
	fs.StringVar(&o.HealthAddr, "health-probe-bind-address", ":8081", "address for /healthz and /readyz ('0' disables)")
}

// NewManager builds the controller-runtime manager of one service, with health checks,
// metrics and (optionally) leader election under the Lease <name>.crdipc.io.
func NewManager(cfg *rest.Config, name string, o ManagerOptions) (manager.Manager, error) {
	if o.MetricsAddr == "" {
		o.MetricsAddr = "0"
	}
	if o.HealthAddr == "" {
		o.HealthAddr = "0"
	}
	if o.Cache.DefaultTransform == nil {
		// No service reads managedFields, and they are often the larger part of a cached
		// object. Updates made from a cached copy keep them: the API server takes the
		// stored managedFields when a request carries none.
		o.Cache.DefaultTransform = cache.TransformStripManagedFields()
	}
	opts := ctrl.Options{
		Scheme:                        scheme.Scheme,
		Cache:                         o.Cache,
		Metrics:                       metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress:        o.HealthAddr,
		LeaderElection:                o.LeaderElect,
		LeaderElectionID:              name + ".crdipc.io",
		LeaderElectionNamespace:       install.SystemNamespace,
		LeaderElectionReleaseOnCancel: true,
		Controller:                    config.Controller{SkipNameValidation: ptr.To(o.Repeatable)},
	}
	if o.Logger.GetSink() != nil {
		opts.Logger = o.Logger
	}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("informers", func(req *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(req.Context()) {
			return errors.New("informer caches not synced")
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return mgr, nil
}

// Standalone is how `crdipc <service>` runs one entry in its own process.
type Standalone struct {
	Cluster   ClusterFlags
	Manager   ManagerOptions
	LogFormat string
	// OTLPEndpoint is where the service exports its spans (see tracing.Options.Endpoint).
	OTLPEndpoint string
}

// AddFlags adds the flags every service command has: the cluster, the log format, and for
// a Controllers entry the manager's.
func (s *Standalone) AddFlags(fs *pflag.FlagSet, e Entry) {
	s.Cluster.AddFlags(fs)
	fs.StringVar(&s.LogFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&s.OTLPEndpoint, "otlp-endpoint", "", "base URL of an OpenTelemetry collector (OTLP, e.g. http://127.0.0.1:4318) to export the service's spans to; default: $OTEL_EXPORTER_OTLP_ENDPOINT (and the other OTEL_EXPORTER_OTLP_* variables); neither: no tracing")
	if e.Kind == Controllers {
		s.Manager.AddFlags(fs)
	}
}

// Logger returns a logger writing to stderr in format, and makes it controller-runtime's.
func Logger(format string) (*slog.Logger, error) {
	var h slog.Handler
	switch format {
	case "text":
		h = slog.NewTextHandler(os.Stderr, nil)
	case "json":
		h = slog.NewJSONHandler(os.Stderr, nil)
	default:
		return nil, fmt.Errorf("unknown log format %q: want text or json", format)
	}
	ctrllog.SetLogger(logr.FromSlogHandler(h))
	return slog.New(h), nil
}

// Run runs svc, an instance of entry e, in this process until ctx ends.
func Run(ctx context.Context, e Entry, svc Service, s Standalone) error {
	logger, err := Logger(s.LogFormat)
	if err != nil {
		return err
	}
	cfg, err := s.Cluster.Config()
	if err != nil {
		return err
	}
	mo := s.Manager
	if e.Kind == Server {
		mo = ManagerOptions{MetricsAddr: "0", HealthAddr: "0"}
	}
	tp, err := tracing.New(ctx, tracing.Options{Endpoint: s.OTLPEndpoint})
	if err != nil {
		return err
	}
	defer func() {
		// The spans of the last requests still go out.
		if err := tp.ShutdownWithin(5 * time.Second); err != nil {
			logger.Warn("flushing spans", "error", err)
		}
	}()
	mgr, err := Build(cfg, e, svc, mo, Env{Config: cfg, Logger: logger.With("service", e.Name), Tracing: tp})
	if err != nil {
		return err
	}
	err = mgr.Start(ctx)
	Stop(svc)
	return err
}

// Build makes the manager of one service and sets the service up on it.
func Build(cfg *rest.Config, e Entry, svc Service, mo ManagerOptions, env Env) (manager.Manager, error) {
	if co, ok := svc.(cacheOptioner); ok {
		c, err := co.CacheOptions()
		if err != nil {
			return nil, err
		}
		mo.Cache = c
	}
	cfg = env.Tracing.RESTConfig(cfg, e.Name) // as is when tracing is off
	if mo.Logger.GetSink() == nil && env.Logger != nil {
		mo.Logger = logr.FromSlogHandler(env.Logger.Handler())
	}
	mgr, err := NewManager(cfg, e.Name, mo)
	if err != nil {
		return nil, err
	}
	env.Config = cfg
	if err := svc.Setup(mgr, env); err != nil {
		return nil, fmt.Errorf("%s: %w", e.Name, err)
	}
	return mgr, nil
}

// listen binds addr for a server of the service: in up through Local, which may move a
// taken default address.
func (env Env) listen(name, addr string) (net.Listener, error) {
	if env.Local != nil && env.Local.Listen != nil {
		return env.Local.Listen(name, addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listening on %s: %w", name, addr, err)
	}
	return ln, nil
}

// say adds a line to up's summary; outside up it does nothing.
func (env Env) say(format string, a ...any) {
	if env.Local != nil && env.Local.Say != nil {
		env.Local.Say(fmt.Sprintf(format, a...))
	}
}

// Start runs mgr in the background and returns once its caches have synced, with the func
// that stops it and waits until it has: how bench and its tests run services in-process.
// The manager's goroutines count as component name (cpushare).
func Start(ctx context.Context, name string, mgr manager.Manager) (stop func(), err error) {
	mctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cpushare.Do(name, func() {
		go func() { done <- mgr.Start(mctx) }()
	})
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		cancel()
		return nil, fmt.Errorf("caches did not sync: %w", <-done)
	}
	return func() { cancel(); <-done }, nil
}
