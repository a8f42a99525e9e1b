package services

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"

	"github.com/spf13/pflag"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/crdipc/crdipc/internal/scm/metricsagent"
	"github.com/crdipc/crdipc/internal/scm/webhook"
)

// DefaultWebhookAddr and DefaultSCMMetricsAddr are where up serves the SCM services.
const (
	DefaultWebhookAddr    = "127.0.0.1:8090"
	DefaultWebhookOpsAddr = "127.0.0.1:8091"
	DefaultSCMMetricsAddr = "127.0.0.1:9102"
)

func webhookListenerEntry() Entry {
	return Entry{
		Name:  "webhook-listener",
		Short: "Turn GitHub webhook deliveries into PullRequest and Branch resources and Events",
		Long: `webhook-listener receives GitHub webhooks on POST /webhook and writes, for
pull_request, create, delete and push deliveries, a PullRequest or Branch
(scm.crdipc.io) with a deterministic name, plus one core/v1 Event per delivery
named <object>.<X-GitHub-Delivery>: a redelivery changes nothing.

Every delivery must carry X-Hub-Signature-256 made with the webhook secret; the
listener refuses to start without one (--secret-file, or $` + webhook.SecretEnv + `).
It answers 2xx only after the object and the Event are stored, 4xx with the
reason for input that can never succeed, and 503 when the API server is
unreachable, so GitHub shows the delivery as failed and it can be redelivered.

/webhook is the only path on --listen, the address GitHub reaches; /healthz,
/readyz (API server reachable) and /metrics are on --ops-listen.
Replicas do not need a leader: every write is idempotent and ordered.`,
		Example: `  crdipc webhook-listener --secret-file /etc/crdipc/webhook-secret --namespace scm
  CRDIPC_WEBHOOK_SECRET=s3cret crdipc webhook-listener --listen 127.0.0.1:8090`,
		Kind: Server,
		New: func() Service {
			return &webhookService{addr: ":8090", opsAddr: ":8091", o: webhook.Options{Namespace: "default", MaxBodyBytes: webhook.DefaultMaxBodyBytes, Timeout: webhook.DefaultTimeout}}
		},
	}
}

type webhookService struct {
	o                         webhook.Options
	secretFile, addr, opsAddr string
}

func (s *webhookService) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&s.o.Namespace, "namespace", s.o.Namespace, "namespace for PullRequests, Branches and their Events")
	fs.StringVar(&s.addr, "listen", s.addr, "address for /webhook, the one GitHub reaches")
	fs.StringVar(&s.opsAddr, "ops-listen", s.opsAddr, "address for /healthz, /readyz and /metrics, apart from the webhook's")
	fs.StringVar(&s.secretFile, "secret-file", "", "file holding the webhook secret (default: $"+webhook.SecretEnv+")")
	fs.Int64Var(&s.o.MaxBodyBytes, "max-body-bytes", s.o.MaxBodyBytes, fmt.Sprintf("largest body accepted (GitHub sends at most %d)", webhook.MaxMaxBodyBytes))
	fs.DurationVar(&s.o.Timeout, "timeout", s.o.Timeout, "budget for storing one delivery; GitHub waits 10s")
	fs.StringVar(&s.o.Instance, "instance", "", "Events' reportingInstance (default: host name)")
}

func (s *webhookService) Setup(mgr manager.Manager, env Env) error {
	o, addr, opsAddr := s.o, s.addr, s.opsAddr
	var secret []byte
	var err error
	if env.Local != nil {
		o.Namespace, addr, opsAddr = env.Local.SCMNamespace, DefaultWebhookAddr, DefaultWebhookOpsAddr
		path := filepath.Join(env.Local.DataDir, "webhook-secret")
		var created bool
		if secret, created, err = webhook.EnsureSecretFile(path); err != nil {
			return err
		}
		defer func() {
			if created {
				env.say("         new webhook secret %s in %s", secret, path)
			} else {
				env.say("         webhook secret in %s", path)
			}
		}()
	} else if secret, err = webhook.LoadSecret(s.secretFile); err != nil {
		return err
	}
	o.Config, o.Secret, o.Logger = env.Config, secret, env.Logger
	l, err := webhook.New(o)
	if err != nil {
		return err
	}
	ln, err := env.listen("webhook listener", addr)
	if err != nil {
		return err
	}
	opsLn, err := env.listen("webhook listener ops", opsAddr)
	if err != nil {
		ln.Close()
		return err
	}
	env.say("webhook  http://%s/webhook   ops http://%s/metrics", ln.Addr(), opsLn.Addr())
	if err := mgr.Add(&HTTPServer{Name: "webhook listener ops", Listener: opsLn, Handler: l.OpsHandler()}); err != nil {
		ln.Close()
		return err
	}
	// Until its cache is synced the listener reads the API server directly, and /readyz
	// says it is not ready yet.
	return serveWithCache(mgr, "webhook listener", ln, l.Handler(), l.Start)
}

func metricsAgentEntry() Entry {
	return Entry{
		Name:  "metrics-agent",
		Short: "Serve Prometheus metrics from PullRequest/Branch Events and resources",
		Long: `metrics-agent watches core/v1 Events about PullRequests and Branches and the
resources themselves, and serves on /metrics:

  crdipc_scm_events_total{kind,reason,type}  each Event occurrence since start, once
  crdipc_scm_pullrequests{state}             open, closed, merged pull requests now
  crdipc_scm_branches{state}                 created, pushed, deleted branches now

Events that existed when the agent started are history and are not counted; a
re-list after a broken watch counts nothing twice. Like every Prometheus
counter, crdipc_scm_events_total starts at 0 in a new process: use rate() or
increase(), which handle the reset. The gauges come from the resources and are
right from the first scrape after /readyz turns ready.

Run one replica: it writes nothing, so there is nothing to elect a leader for,
and two replicas would each report every Event.`,
		Example: `  crdipc metrics-agent --namespace scm --listen :9102`,
		Kind:    Server,
		New: func() Service {
			return &metricsAgentService{addr: ":9102", o: metricsagent.Options{Resync: metricsagent.DefaultResync}}
		},
	}
}

type metricsAgentService struct {
	o    metricsagent.Options
	addr string
}

func (s *metricsAgentService) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&s.o.Namespace, "namespace", "", "watch only this namespace (default: all namespaces)")
	fs.StringVar(&s.addr, "listen", s.addr, "address for /metrics, /healthz and /readyz")
	fs.DurationVar(&s.o.Resync, "resync", s.o.Resync, "informer resync period (replays the cache; counts nothing)")
}

func (s *metricsAgentService) Setup(mgr manager.Manager, env Env) error {
	o, addr := s.o, s.addr
	if env.Local != nil {
		o.Namespace, addr = env.Local.SCMNamespace, DefaultSCMMetricsAddr
	}
	o.Config, o.Logger = env.Config, env.Logger
	a, err := metricsagent.New(o)
	if err != nil {
		return err
	}
	ln, err := env.listen("metrics agent", addr)
	if err != nil {
		return err
	}
	env.say("scm      http://%s/metrics   (metrics agent: PullRequest/Branch Events and gauges)", ln.Addr())
	return serveWithCache(mgr, "metrics agent", ln, a.Handler(), a.Start)
}

// serveWithCache adds a server whose handler answers from a cache that start fills (and
// keeps current until ctx ends): the cache's runnable, and the HTTP server on ln.
func serveWithCache(mgr manager.Manager, name string, ln net.Listener, h http.Handler, start func(context.Context) error) error {
	if err := mgr.Add(runnableFunc(func(ctx context.Context) error {
		if err := start(ctx); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	})); err != nil {
		ln.Close()
		return err
	}
	return mgr.Add(&HTTPServer{Name: name, Listener: ln, Handler: h})
}
