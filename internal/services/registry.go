package services

import (
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/crdipc/crdipc/internal/tracing"
)

// Kind says how an entry's service runs.
type Kind int

const (
	// Controllers reconcile through a manager's cache; two replicas would conflict, so
	// outside up they elect a leader, and the manager serves /metrics and the probes.
	Controllers Kind = iota
	// Server answers requests (HTTP, gRPC) and needs no leader: every replica serves.
	// It serves its own probes and metrics.
	Server
)

// Entry is one row of the table.
type Entry struct {
	// Name is the subcommand, the ServiceAccount crdipc-<Name> and config/rbac/<Name>.
	Name string
	// Aliases are other names of its command.
	Aliases []string
	// Short, Long and Example are its command's help.
	Short, Long, Example string
	Kind                 Kind
	// New returns the service with its default options.
	New func() Service
}

// Service is an entry's service with its options.
type Service interface {
	// AddFlags binds the service's own options to flags.
	AddFlags(fs *pflag.FlagSet)
	// Setup adds the service to mgr, whose client acts as the service's identity.
	Setup(mgr manager.Manager, env Env) error
}

// Env is what a service gets from where it runs.
type Env struct {
	// Config is the service's identity on the API server (mgr's config).
	Config *rest.Config
	// Logger is the service's structured logger; controller-runtime logs to it too.
	Logger *slog.Logger
	// Local is set when the service runs inside `crdipc up`, with every other service.
	Local *Local
	// Tracing, when set and enabled, traces the service's requests: Build wraps its client
	// so that kube-apiserver continues a request's trace, and receivers take
	// TracerProvider. nil and a Provider that is off trace nothing.
	Tracing *tracing.Provider
}

// TracerProvider is the service's tracer provider, nil without Tracing or with it off (ipc then uses
// the global one, a no-op unless a program sets it).
func (env Env) TracerProvider(service string) trace.TracerProvider {
	if !env.Tracing.Enabled() {
		return nil
	}
	return env.Tracing.Service(service)
}

// Local is one machine running the selected services in one process (crdipc up).
type Local struct {
	// DataDir holds everything up keeps.
	DataDir string
	// Nodes is how many simulated nodes up starts.
	Nodes int
	// SCMNamespace holds PullRequests, Branches and their Events.
	SCMNamespace string
	// Listen binds a listener for name at addr; a taken default address moves to a free port.
	Listen func(name, addr string) (net.Listener, error)
	// Config returns the client config of another identity: the simulated nodes run the
	// CSI node plugins as "csi-node".
	Config func(service string) (*rest.Config, error)
	// NodeConfig is Config with a token bound to a node, for a service that runs once
	// per node (the pool agents); nil: Config's.
	NodeConfig func(service, node string) (*rest.Config, error)
	// KubeletConfig returns the client config of a simulated node's kubelet,
	// system:node:<node>: each node writes about itself, its Lease and its pods as itself,
	// which the Node authorizer and NodeRestriction admission check as for a real kubelet.
	// nil: the simulated nodes act with the service's own config.
	KubeletConfig func(node string) (*rest.Config, error)
	// Say adds a line to what up prints about its services: addresses, secrets.
	Say func(line string)
}

// cacheOptioner is a service that narrows what its manager caches.
type cacheOptioner interface {
	CacheOptions() (cache.Options, error)
}

// Stop stops what svc runs beside its manager (the simulated nodes' CSI node plugins), if
// anything; call it after the manager stopped.
func Stop(svc Service) {
	if st, ok := svc.(interface{ Stop() }); ok {
		st.Stop()
	}
}

// Table is every crdipc service, in the order up starts them (and stops them in reverse:
// the simulated nodes, last, stop first, unstaging their volumes while the storage
// services still run).
func Table() []Entry {
	return []Entry{
		booksEntry(),
		storageOperatorEntry(),
		poolAgentEntry(),
		csiDriverEntry(),
		csiSidecarEntry(),
		snapshotControllerEntry(),
		bitcoinOperatorEntry(),
		webhookListenerEntry(),
		metricsAgentEntry(),
		nodesEntry(),
	}
}

// Lookup returns the entry named name.
func Lookup(name string) (Entry, bool) {
	for _, e := range Table() {
		if e.Name == name {
			return e, true
		}
	}
	return Entry{}, false
}

// Names lists the table's names, in order.
func Names() []string {
	var names []string
	for _, e := range Table() {
		names = append(names, e.Name)
	}
	return names
}

// Select returns the entries named in enable (comma-separated; "all" or "" for every entry,
// "none" for none) minus those in disable, in table order.
func Select(enable, disable string) ([]Entry, error) {
	pick := func(list string) (map[string]bool, error) {
		set := map[string]bool{}
		for _, n := range strings.Split(list, ",") {
			n = strings.TrimSpace(n)
			switch {
			case n == "":
			case n == "all":
				for _, e := range Table() {
					set[e.Name] = true
				}
			case n == "none":
			default:
				if _, ok := Lookup(n); !ok {
					return nil, fmt.Errorf("unknown service %q: the services are %s", n, strings.Join(Names(), ", "))
				}
				set[n] = true
			}
		}
		return set, nil
	}
	if strings.TrimSpace(enable) == "" {
		enable = "all"
	}
	on, err := pick(enable)
	if err != nil {
		return nil, err
	}
	if slices.Contains(strings.Split(enable, ","), "none") && len(on) > 0 {
		return nil, fmt.Errorf("--services: none cannot be combined with other services")
	}
	off, err := pick(disable)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, e := range Table() {
		if on[e.Name] && !off[e.Name] {
			out = append(out, e)
		}
	}
	return out, nil
}
