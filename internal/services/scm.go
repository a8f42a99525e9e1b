package services

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"time"

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
(scm.crdipc.io) with a deterministic name, plus one core/v1 Event per body
named <object>.sha256-<body digest>: a redelivery changes nothing.

Every delivery must carry X-Hub-Signature-256 made with the webhook secret; the
listener refuses to start without one (--secret-file, or $` + webhook.SecretEnv + `).
It answers 2xx only after the object, the Event and the record below are
stored, 4xx with the reason for input that can never succeed, and 503 when the API server is
unreachable, so GitHub shows the delivery as failed and it can be redelivered.

Each body it stores is recorded as a Delivery (scm.crdipc.io, named sha256-<body
digest>) for --delivery-retention: a redelivery days later, after its Event is
gone, writes nothing; the same signed body replayed as another event, or another
body under a recorded delivery ID, is refused (409).

Work before a delivery is authenticated is bounded: at most --max-connections
open connections (more wait to be accepted) and --max-concurrent-requests
deliveries being read and stored; one more is answered 503 with Retry-After,
without reading its body. Bodies over --max-body-bytes are refused (413).

/webhook is the only path on --listen, the address GitHub reaches; /healthz,
/readyz (API server reachable) and /metrics are on --ops-listen.
Replicas do not need a leader: every write is idempotent and ordered.`,
		Example: `  crdipc webhook-listener --secret-file /etc/crdipc/webhook-secret --namespace scm
  CRDIPC_WEBHOOK_SECRET=s3cret crdipc webhook-listener --listen 127.0.0.1:8090`,
		Kind: Server,
		New: func() Service {
			return &webhookService{addr: ":8090", opsAddr: ":8091", o: webhook.Options{Namespace: "default", MaxBodyBytes: webhook.DefaultMaxBodyBytes, Timeout: webhook.DefaultTimeout,
				MaxConcurrentRequests: webhook.DefaultMaxConcurrentRequests, MaxConnections: webhook.DefaultMaxConnections, DeliveryRetention: webhook.DefaultDeliveryRetention}}
		},
	}
}

type webhookService struct {
	o                         webhook.Options
	secretFile, addr, opsAddr string
}

func (s *webhookService) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&s.o.Namespace, "namespace", s.o.Namespace, "namespace for PullRequests, Branches, their Events and Delivery records")
	fs.StringVar(&s.addr, "listen", s.addr, "address for /webhook, the one GitHub reaches")
	fs.StringVar(&s.opsAddr, "ops-listen", s.opsAddr, "address for /healthz, /readyz and /metrics, apart from the webhook's")
	fs.StringVar(&s.secretFile, "secret-file", "", "file holding the webhook secret (default: $"+webhook.SecretEnv+")")
	fs.Int64Var(&s.o.MaxBodyBytes, "max-body-bytes", s.o.MaxBodyBytes, fmt.Sprintf("largest body accepted (GitHub sends at most %d)", webhook.MaxMaxBodyBytes))
	fs.DurationVar(&s.o.Timeout, "timeout", s.o.Timeout, "budget for storing one delivery; GitHub waits 10s")
	fs.IntVar(&s.o.MaxConcurrentRequests, "max-concurrent-requests", s.o.MaxConcurrentRequests, "deliveries read, verified and stored at once; one more is answered 503 with Retry-After, its body unread (memory for bodies: this × --max-body-bytes)")
	fs.IntVar(&s.o.MaxConnections, "max-connections", s.o.MaxConnections, "open connections on --listen, keep-alives included; more wait to be accepted")
	fs.DurationVar(&s.o.DeliveryRetention, "delivery-retention", s.o.DeliveryRetention, "how long a Delivery record is kept to recognize redeliveries and replays (GitHub redelivers for 3 days)")
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
	o.TracerProvider = env.TracerProvider("webhook-listener")
	l, err := webhook.New(o)
	if err != nil {
		return err
	}
	ln, err := env.listen("webhook listener", addr)
	if err != nil {
		return err
	}
	ln = l.LimitListener(ln)
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

crdipc_scm_events_total continues across restarts from a checkpoint ConfigMap
(--checkpoint-namespace/--checkpoint-name, written every --checkpoint-interval and
on shutdown): Events created while the agent was down are counted, none twice,
and a re-list after a broken watch counts nothing twice. On its very first start
(no checkpoint) existing Events are history and are not counted. The gauges come
from the resources and are right from the first scrape after /readyz turns ready.

Run one replica: a newer agent takes the checkpoint over from an older one, but
two serving at once would each report every Event.`,
		Example: `  crdipc metrics-agent --namespace scm --listen :9102`,
		Kind:    Server,
		New: func() Service {
			return &metricsAgentService{addr: ":9102", o: metricsagent.Options{Resync: metricsagent.DefaultResync,
				CheckpointName: metricsagent.DefaultCheckpointName, CheckpointInterval: metricsagent.DefaultCheckpointInterval}}
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
	fs.StringVar(&s.o.CheckpointNamespace, "checkpoint-namespace", "", "namespace of the ConfigMap the count is kept in across restarts (default: --namespace; required without it)")
	fs.StringVar(&s.o.CheckpointName, "checkpoint-name", s.o.CheckpointName, "name of that ConfigMap (the shipped role grants only the default)")
	fs.DurationVar(&s.o.CheckpointInterval, "checkpoint-interval", s.o.CheckpointInterval, "how often a changed count is checkpointed (also on shutdown)")
}

func (s *metricsAgentService) Setup(mgr manager.Manager, env Env) error {
	o, addr := s.o, s.addr
	if env.Local != nil {
		o.Namespace, addr = env.Local.SCMNamespace, DefaultSCMMetricsAddr
	}
	o.Config, o.Logger = env.Config, env.Logger
	o.TracerProvider = env.TracerProvider("metrics-agent")
	a, err := metricsagent.New(o)
	if err != nil {
		return err
	}
	ln, err := env.listen("metrics agent", addr)
	if err != nil {
		return err
	}
	env.say("scm      http://%s/metrics   (metrics agent: PullRequest/Branch Events and gauges)", ln.Addr())
	if err := serveWithCache(mgr, "metrics agent", ln, a.Handler(), a.Start); err != nil {
		return err
	}
	// The manager waits for its runnables at shutdown: this one holds it until the agent
	// wrote its last checkpoint, so a clean stop loses no count to the next start.
	return mgr.Add(runnableFunc(func(ctx context.Context) error {
		<-ctx.Done()
		select {
		case <-a.Stopped():
		case <-time.After(checkpointOnStop):
		}
		return nil
	}))
}

// checkpointOnStop bounds how long a stopping metrics agent may take to write its checkpoint.
const checkpointOnStop = 15 * time.Second

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
