package webhook

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/netutil"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
	"github.com/crdipc/crdipc/internal/scheme"
)

// Body size limits. GitHub caps payloads at 25 MiB; most are a few KiB.
const (
	DefaultMaxBodyBytes = 1 << 20
	MaxMaxBodyBytes     = 25 << 20
)

// DefaultTimeout is the budget for storing one delivery. GitHub gives up on a delivery after
// 10 s, so answering 503 before then shows the delivery as failed rather than timed out.
const DefaultTimeout = 8 * time.Second

// SecretEnv is the environment variable the CLI reads the secret from when no file is given.
const SecretEnv = "CRDIPC_WEBHOOK_SECRET"

// Bounds on work done before a delivery is authenticated. Anyone can open connections and
// start requests; only the signature, checked once the body is read, tells GitHub apart.
const (
	// DefaultMaxConcurrentRequests bounds deliveries being read, verified and stored at once:
	// GitHub sends bursts of a few per second, each stored in tens of milliseconds. Memory held
	// by bodies is at most this times MaxBodyBytes.
	DefaultMaxConcurrentRequests = 32
	// DefaultMaxConnections bounds open connections, idle keep-alives included.
	DefaultMaxConnections = 256
)

// DefaultDeliveryRetention is how long a Delivery record is kept: GitHub lets a delivery be
// redelivered for 3 days.
const DefaultDeliveryRetention = 72 * time.Hour

// The listener's permissions, in the namespace it writes to (config/rbac/webhook-listener binds
// them there with a RoleBinding): read its PullRequests and Branches (its cache lists and
// watches them), create and update them, never delete; create Events, and get one for the
// redelivery check of same-second deliveries and of records an earlier listener left pending;
// and keep its Delivery records: create one per body, complete, read them (its cache lists and
// watches them) and delete them after the retention. Update only completes a record an earlier
// listener left pending (the CRD refuses any change to a complete one).
// +kubebuilder:rbac:groups=scm.crdipc.io,resources=pullrequests;branches,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",resources=events,verbs=get;create
// +kubebuilder:rbac:groups=scm.crdipc.io,resources=deliveries,verbs=get;list;watch;create;update;delete

// Options configure a Listener.
type Options struct {
	// Config reaches the API server. Required.
	Config *rest.Config
	// Namespace receives the PullRequests, Branches and Events. Required.
	Namespace string
	// Secret is the webhook secret configured on GitHub. Required: without it anyone who can
	// reach the listener could write objects.
	Secret []byte
	// MaxBodyBytes bounds a delivery's body (default DefaultMaxBodyBytes, at most
	// MaxMaxBodyBytes).
	MaxBodyBytes int64
	// Timeout bounds the API writes for one delivery (default DefaultTimeout).
	Timeout time.Duration
	// MaxConcurrentRequests bounds the deliveries being read, verified and stored at once
	// (default DefaultMaxConcurrentRequests). One more is answered 503 with Retry-After,
	// without reading its body.
	MaxConcurrentRequests int
	// MaxConnections bounds the connections LimitListener keeps open (default
	// DefaultMaxConnections); further ones wait in the kernel's accept queue.
	MaxConnections int
	// DeliveryRetention is how long a Delivery record, the listener's memory of a body it
	// accepted, is kept (default DefaultDeliveryRetention).
	DeliveryRetention time.Duration
	// RecordGCInterval is how often Start's collector deletes records older than
	// DeliveryRetention (default: a quarter of the retention, at most an hour).
	RecordGCInterval time.Duration
	// Instance is the Events' reportingInstance (default: the host name).
	Instance string
	// Logger receives one line per delivery (default slog.Default()).
	Logger *slog.Logger
	// Registry receives the listener's metrics (default: a new registry with Go and process
	// collectors). Never the global registry, so several listeners can live in one process.
	Registry *prometheus.Registry
	// TracerProvider traces each delivery whose signature holds, from its arrival to its
	// answer, and stores the trace on the objects and the Event it writes
	// (ipc.TraceParentAnnotation), where the metrics agent continues it. Default: the
	// global provider.
	TracerProvider trace.TracerProvider
}

// Listener receives GitHub webhook deliveries.
type Listener struct {
	opts   Options
	client client.Client
	rest   rest.Interface
	// cache holds the namespace's PullRequests and Branches once Start ran; synced says so.
	cache   cache.Cache
	synced  atomic.Bool
	started atomic.Bool
	metrics *metrics
	// inFlight holds a token per delivery being read, verified or stored.
	inFlight chan struct{}
	handler  http.Handler
	ops      http.Handler
}

// New checks opts and returns a Listener; it does not contact the API server.
func New(opts Options) (*Listener, error) {
	if len(opts.Secret) == 0 {
		return nil, errors.New("webhook secret is empty: refusing to accept unsigned deliveries")
	}
	if opts.Config == nil {
		return nil, errors.New("no API server config")
	}
	if opts.Namespace == "" {
		return nil, errors.New("no namespace")
	}
	switch {
	case opts.MaxBodyBytes == 0:
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	case opts.MaxBodyBytes < 0 || opts.MaxBodyBytes > MaxMaxBodyBytes:
		return nil, fmt.Errorf("body limit %d bytes is outside 1..%d (GitHub's maximum)", opts.MaxBodyBytes, MaxMaxBodyBytes)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	for _, v := range []struct {
		name string
		n    *int
		def  int
	}{{"concurrent request limit", &opts.MaxConcurrentRequests, DefaultMaxConcurrentRequests}, {"connection limit", &opts.MaxConnections, DefaultMaxConnections}} {
		switch {
		case *v.n == 0:
			*v.n = v.def
		case *v.n < 0:
			return nil, fmt.Errorf("%s %d is negative", v.name, *v.n)
		}
	}
	switch {
	case opts.DeliveryRetention == 0:
		opts.DeliveryRetention = DefaultDeliveryRetention
	case opts.DeliveryRetention < 0:
		return nil, fmt.Errorf("delivery retention %s is negative", opts.DeliveryRetention)
	}
	switch {
	case opts.RecordGCInterval == 0:
		opts.RecordGCInterval = min(opts.DeliveryRetention/4, time.Hour)
	case opts.RecordGCInterval < 0:
		return nil, fmt.Errorf("record collection interval %s is negative", opts.RecordGCInterval)
	}
	if opts.TracerProvider == nil {
		opts.TracerProvider = otel.GetTracerProvider()
	}
	if opts.Instance == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("reading host name for reportingInstance: %w", err)
		}
		opts.Instance = h
	}
	if len(opts.Instance) > 128 {
		opts.Instance = opts.Instance[:128]
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
		opts.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	c, err := client.New(opts.Config, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("creating API client: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(opts.Config)
	if err != nil {
		return nil, fmt.Errorf("creating API health client: %w", err)
	}
	m, err := newMetrics(opts.Registry)
	if err != nil {
		return nil, err
	}
	cc, err := cache.New(opts.Config, cache.Options{
		Scheme:            scheme.Scheme,
		DefaultNamespaces: map[string]cache.Config{opts.Namespace: {}},
	})
	if err != nil {
		return nil, fmt.Errorf("creating cache: %w", err)
	}
	l := &Listener{opts: opts, client: c, rest: dc.RESTClient(), cache: cc, metrics: m,
		inFlight: make(chan struct{}, opts.MaxConcurrentRequests)}
	// Two handlers for two ports: what GitHub (the Internet) reaches, and what the cluster's
	// probes and Prometheus do. Nothing about the listener's internals faces the Internet.
	mux := http.NewServeMux()
	mux.Handle("/webhook", http.HandlerFunc(l.serveWebhook))
	l.handler = mux
	ops := http.NewServeMux()
	ops.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	ops.HandleFunc("/readyz", l.serveReady)
	ops.Handle("/metrics", promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{Registry: opts.Registry}))
	l.ops = ops
	return l, nil
}

// OpsHandler serves /healthz, /readyz and /metrics: serve it on a port of its own, apart
// from Handler's, which faces GitHub.
func (l *Listener) OpsHandler() http.Handler { return l.ops }

// Handler serves /webhook, and nothing else: it faces the Internet.
func (l *Listener) Handler() http.Handler { return l.handler }

// Registry is the registry the listener's metrics are in.
func (l *Listener) Registry() *prometheus.Registry { return l.opts.Registry }

// LimitListener bounds the connections ln keeps open at Options.MaxConnections: serve
// Handler on what it returns. A connection over the limit is not accepted until another
// closes; it waits in the kernel's accept queue.
func (l *Listener) LimitListener(ln net.Listener) net.Listener {
	return netutil.LimitListener(ln, l.opts.MaxConnections)
}

// Start fills the listener's cache of PullRequests, Branches and Delivery records and keeps it
// current until ctx ends, and from then on deletes expired records every RecordGCInterval; it
// returns once the cache is synced. A listener that was not started still works: every
// delivery then reads the API server directly, and records are kept until a started listener
// deletes them.
func (l *Listener) Start(ctx context.Context) error {
	if !l.started.CompareAndSwap(false, true) {
		return errors.New("webhook listener already started")
	}
	for _, obj := range []client.Object{&scmv1alpha1.PullRequest{}, &scmv1alpha1.Branch{}, &scmv1alpha1.Delivery{}} {
		if _, err := l.cache.GetInformer(ctx, obj); err != nil {
			return fmt.Errorf("starting informer: %w", err)
		}
	}
	if err := l.cache.IndexField(ctx, &scmv1alpha1.Delivery{}, deliveryIDField, func(o client.Object) []string {
		return []string{o.(*scmv1alpha1.Delivery).Spec.DeliveryID}
	}); err != nil {
		return fmt.Errorf("indexing delivery records: %w", err)
	}
	go func() {
		if err := l.cache.Start(ctx); err != nil {
			l.opts.Logger.Error("webhook listener cache stopped", "error", err)
		}
	}()
	if !l.cache.WaitForCacheSync(ctx) {
		return fmt.Errorf("waiting for the cache to sync: %w", context.Cause(ctx))
	}
	l.synced.Store(true)
	go wait.UntilWithContext(ctx, l.collectRecords, l.opts.RecordGCInterval)
	return nil
}

// serveReady is ready when the API server answers (and the cache is synced, once started): a
// listener that cannot store deliveries should be taken out of its Service rather than
// answer 503 to each.
func (l *Listener) serveReady(w http.ResponseWriter, r *http.Request) {
	if l.started.Load() && !l.synced.Load() {
		http.Error(w, "cache not synced yet", http.StatusServiceUnavailable)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := l.rest.Get().AbsPath("/readyz").Do(ctx).Error(); err != nil {
		http.Error(w, "API server not ready: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}

// LoadSecret reads the webhook secret from path, or from $SecretEnv when path is empty. A
// trailing newline is dropped: `echo secret > file` is how most people write one.
func LoadSecret(path string) ([]byte, error) {
	var s string
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("reading webhook secret: %w", err)
		}
		s = string(b)
	} else {
		s = os.Getenv(SecretEnv)
	}
	s = strings.TrimRight(s, "\r\n")
	if s == "" {
		src := "$" + SecretEnv
		if path != "" {
			src = path
		}
		return nil, fmt.Errorf("webhook secret from %s is empty: refusing to accept unsigned deliveries", src)
	}
	return []byte(s), nil
}

// EnsureSecretFile returns the secret in path, generating a random one (0600) when the file
// does not exist yet, as `crdipc up` does in its data directory. created reports a new secret.
func EnsureSecretFile(path string) (secret []byte, created bool, err error) {
	if _, err := os.Stat(path); err == nil {
		s, err := LoadSecret(path)
		return s, false, err
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, false, fmt.Errorf("reading webhook secret: %w", err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, false, fmt.Errorf("generating webhook secret: %w", err)
	}
	s := hex.EncodeToString(raw)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, false, fmt.Errorf("creating directory for webhook secret: %w", err)
	}
	// O_EXCL: two processes racing on a fresh data dir must not end up with different secrets.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		s, err := LoadSecret(path)
		return s, false, err
	}
	if err != nil {
		return nil, false, fmt.Errorf("writing webhook secret: %w", err)
	}
	if _, err := f.WriteString(s + "\n"); err != nil {
		f.Close()
		return nil, false, fmt.Errorf("writing webhook secret: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, false, fmt.Errorf("writing webhook secret: %w", err)
	}
	return []byte(s), true, nil
}
