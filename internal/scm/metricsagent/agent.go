package metricsagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
	"github.com/crdipc/crdipc/internal/scheme"
)

// DefaultResync is how often the informers replay their caches to the handlers. Replays add
// nothing to the counter; they are a safety net for handlers, cheap because nothing is listed.
const DefaultResync = 10 * time.Minute

// The agent lists and watches what it counts and writes only its checkpoint (checkpoint.go);
// config/rbac/metrics-agent binds this in the namespace it watches, or cluster-wide when it
// watches every namespace.
// +kubebuilder:rbac:groups="",resources=events,verbs=list;watch
// +kubebuilder:rbac:groups=scm.crdipc.io,resources=pullrequests;branches,verbs=list;watch

// Options configure an Agent.
type Options struct {
	// Config reaches the API server. Required.
	Config *rest.Config
	// Namespace limits the agent to one namespace; empty watches all namespaces.
	Namespace string
	// Resync is the informers' resync period (default DefaultResync).
	Resync time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Registry receives the agent's metrics (default: a new registry with Go and process
	// collectors); never the global one.
	Registry *prometheus.Registry

	// CheckpointNamespace and CheckpointName name the ConfigMap the counter's state is kept
	// in across restarts (default: Namespace and DefaultCheckpointName). The namespace is
	// required when Namespace is empty.
	CheckpointNamespace, CheckpointName string
	// CheckpointInterval is how often a changed state is written (default
	// DefaultCheckpointInterval); it is also written once synced and on shutdown.
	CheckpointInterval time.Duration
	// TracerProvider records a span when an Event that carries a trace
	// (ipc.TraceParentAnnotation, as the webhook listener writes it) is counted, in that
	// trace. Default: the global provider.
	TracerProvider trace.TracerProvider
}

// Agent turns Events and resources into Prometheus metrics.
type Agent struct {
	opts   Options
	kube   kubernetes.Interface
	client client.WithWatch

	events, prs, branches cache.SharedIndexInformer
	counter               *eventCounter
	ckpt                  *checkpointer
	lists                 *prometheus.CounterVec
	start                 atomic.Pointer[time.Time]
	synced                atomic.Bool
	stopped               chan struct{}
	handler               http.Handler
}

// New checks opts and builds the agent; it contacts nothing until Run.
func New(opts Options) (*Agent, error) {
	if opts.Config == nil {
		return nil, errors.New("no API server config")
	}
	if opts.Resync <= 0 {
		opts.Resync = DefaultResync
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.CheckpointNamespace == "" {
		opts.CheckpointNamespace = opts.Namespace
	}
	if opts.CheckpointNamespace == "" {
		return nil, errors.New("watching all namespaces: a checkpoint namespace is required (--checkpoint-namespace)")
	}
	if errs := validation.IsDNS1123Label(opts.CheckpointNamespace); len(errs) > 0 {
		return nil, fmt.Errorf("checkpoint namespace %q: %s", opts.CheckpointNamespace, strings.Join(errs, "; "))
	}
	if opts.CheckpointName == "" {
		opts.CheckpointName = DefaultCheckpointName
	}
	if errs := validation.IsDNS1123Subdomain(opts.CheckpointName); len(errs) > 0 {
		return nil, fmt.Errorf("checkpoint name %q: %s", opts.CheckpointName, strings.Join(errs, "; "))
	}
	if opts.CheckpointInterval <= 0 {
		opts.CheckpointInterval = DefaultCheckpointInterval
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
		opts.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	kube, err := kubernetes.NewForConfig(opts.Config)
	if err != nil {
		return nil, fmt.Errorf("creating clientset: %w", err)
	}
	c, err := client.NewWithWatch(opts.Config, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	a := &Agent{opts: opts, kube: kube, client: c, counter: newEventCounter(), stopped: make(chan struct{})}
	a.counter.tp = opts.TracerProvider
	a.lists = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "crdipc_scm_agent_lists_total",
		Help: "Successful full lists (initial and after a broken watch) by resource; each is a re-list the event counter must not double count.",
	}, []string{"resource"})
	writes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "crdipc_scm_agent_checkpoint_writes_total",
		Help: "Checkpoint writes by result: written; failed (retried at the next interval); superseded (another agent claimed the checkpoint, this one no longer writes it).",
	}, []string{"result"})
	for _, r := range []string{"written", "failed", "superseded"} {
		writes.WithLabelValues(r)
	}
	for _, col := range []prometheus.Collector{a.lists, writes, a.counter, &gauges{a: a}} {
		if err := opts.Registry.Register(col); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	a.ckpt = newCheckpointer(kube.CoreV1().ConfigMaps(opts.CheckpointNamespace), opts.CheckpointNamespace, opts.CheckpointName,
		opts.Namespace, opts.Logger, writes)

	evLW := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = fields.OneTermEqualSelector("involvedObject.apiVersion", scmv1alpha1.GroupVersion.String()).String()
			l, err := kube.CoreV1().Events(opts.Namespace).List(ctx, o)
			a.listed("events", err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = fields.OneTermEqualSelector("involvedObject.apiVersion", scmv1alpha1.GroupVersion.String()).String()
			w, err := kube.CoreV1().Events(opts.Namespace).Watch(ctx, o)
			if isStreamingList(o) {
				a.listed("events", err)
			}
			return w, err
		},
	}
	a.events = cache.NewSharedIndexInformer(evLW, &corev1.Event{}, opts.Resync, cache.Indexers{})
	a.prs = cache.NewSharedIndexInformer(a.crListWatch("pullrequests", &scmv1alpha1.PullRequestList{}), &scmv1alpha1.PullRequest{}, opts.Resync, cache.Indexers{})
	a.branches = cache.NewSharedIndexInformer(a.crListWatch("branches", &scmv1alpha1.BranchList{}), &scmv1alpha1.Branch{}, opts.Resync, cache.Indexers{})

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{Registry: opts.Registry}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.HasSynced() {
			http.Error(w, "caches not synced yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	a.handler = mux
	return a, nil
}

func isStreamingList(o metav1.ListOptions) bool {
	return o.SendInitialEvents != nil && *o.SendInitialEvents
}

func (a *Agent) listed(resource string, err error) {
	if err == nil {
		a.lists.WithLabelValues(resource).Inc()
	}
}

// crListWatch lists and watches a crdipc kind through the scheme-aware client (there is no
// generated clientset for our kinds).
func (a *Agent) crListWatch(resource string, list client.ObjectList) *cache.ListWatch {
	opts := func(o metav1.ListOptions) []client.ListOption {
		return []client.ListOption{client.InNamespace(a.opts.Namespace), &client.ListOptions{Raw: &o}}
	}
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			l := list.DeepCopyObject().(client.ObjectList)
			err := a.client.List(ctx, l, opts(o)...)
			a.listed(resource, err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := a.client.Watch(ctx, list.DeepCopyObject().(client.ObjectList), opts(o)...)
			if isStreamingList(o) {
				a.listed(resource, err)
			}
			return w, err
		},
	}
}

// Handler serves /metrics, /healthz and /readyz.
func (a *Agent) Handler() http.Handler { return a.handler }

// Registry is the registry the agent's metrics are in.
func (a *Agent) Registry() *prometheus.Registry { return a.opts.Registry }

// HasSynced reports whether all three caches hold a full list and the counter has handled
// the Events'.
func (a *Agent) HasSynced() bool { return a.synced.Load() }

// Stopped is closed once the agent has stopped after Start's ctx ended (or Start failed) and
// its last checkpoint is written (or failed to be).
func (a *Agent) Stopped() <-chan struct{} { return a.stopped }

// StartTime is when Start began: without a checkpoint, Events stamped before it are history.
func (a *Agent) StartTime() time.Time {
	if t := a.start.Load(); t != nil {
		return *t
	}
	return time.Time{}
}

// Start claims the checkpoint and resumes from it, runs the informers until ctx ends and
// returns once their caches are synced; serve Handler meanwhile (crdipc serves it with
// services.HTTPServer): /readyz says when it is. It then checkpoints every
// CheckpointInterval and once more when ctx ends; Stopped says when that is done.
func (a *Agent) Start(ctx context.Context) error {
	now := time.Now()
	if !a.start.CompareAndSwap(nil, &now) {
		return errors.New("metrics agent already started")
	}
	running := false
	defer func() {
		if !running {
			close(a.stopped)
		}
	}()
	a.counter.start = now
	// Before anything is counted: the state to continue from, and no other agent writing.
	s, err := a.ckpt.claim(ctx)
	if err != nil {
		return err
	}
	if s != nil {
		a.counter.resume(*s)
	}
	reg, err := a.events.AddEventHandler(a.counter)
	if err != nil {
		return fmt.Errorf("adding event handler: %w", err)
	}
	for _, inf := range []cache.SharedIndexInformer{a.events, a.prs, a.branches} {
		go inf.RunWithContext(ctx)
	}
	if !cache.WaitForCacheSync(ctx.Done(), a.events.HasSynced, a.prs.HasSynced, a.branches.HasSynced, reg.HasSynced) {
		return fmt.Errorf("waiting for caches to sync: %w", context.Cause(ctx))
	}
	a.counter.markSynced()
	a.synced.Store(true)
	running = true
	go a.checkpointLoop(ctx)
	a.opts.Logger.Info("metrics agent caches synced", "namespace", a.opts.Namespace, "resumed", s != nil,
		"took", time.Since(now).Round(time.Millisecond))
	return nil
}

// checkpointLoop writes the checkpoint at once (on a first start this records the history
// Events, so a restart does not take them for new), every interval, and when ctx ends.
func (a *Agent) checkpointLoop(ctx context.Context) {
	defer close(a.stopped)
	t := time.NewTicker(a.opts.CheckpointInterval)
	defer t.Stop()
	for {
		if err := a.ckpt.write(ctx, a.counter); err != nil && ctx.Err() == nil {
			a.opts.Logger.Error("checkpoint not written; retrying at the next interval", "err", err)
		}
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalWriteTimeout)
			defer cancel()
			if err := a.ckpt.write(final, a.counter); err != nil {
				a.opts.Logger.Error("final checkpoint not written: the next agent counts again, from the previous one, what this one counted since", "err", err)
			}
			return
		case <-t.C:
		}
	}
}
