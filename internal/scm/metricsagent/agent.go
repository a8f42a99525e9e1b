package metricsagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
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

// The agent writes nothing: it lists and watches what it counts (config/rbac/metrics-agent
// binds this in the namespace it watches, or cluster-wide when it watches every namespace).
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
}

// Agent turns Events and resources into Prometheus metrics.
type Agent struct {
	opts   Options
	kube   kubernetes.Interface
	client client.WithWatch

	events, prs, branches cache.SharedIndexInformer
	counter               *eventCounter
	lists                 *prometheus.CounterVec
	start                 atomic.Pointer[time.Time]
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
	a := &Agent{opts: opts, kube: kube, client: c}
	a.lists = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "crdipc_scm_agent_lists_total",
		Help: "Successful full lists (initial and after a broken watch) by resource; each is a re-list the event counter must not double count.",
	}, []string{"resource"})
	total := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "crdipc_scm_events_total",
		Help: "Occurrences of Events about PullRequests and Branches since this agent started, each counted once.",
	}, []string{"kind", "reason", "type"})
	for _, col := range []prometheus.Collector{a.lists, total, &gauges{a: a}} {
		if err := opts.Registry.Register(col); err != nil {
			return nil, fmt.Errorf("registering metrics: %w", err)
		}
	}
	a.counter = newEventCounter(time.Time{}, total)

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

// HasSynced reports whether all three caches hold a full list.
func (a *Agent) HasSynced() bool {
	return a.events.HasSynced() && a.prs.HasSynced() && a.branches.HasSynced()
}

// StartTime is when Run started the informers: Events stamped before it are history.
func (a *Agent) StartTime() time.Time {
	if t := a.start.Load(); t != nil {
		return *t
	}
	return time.Time{}
}

// Start runs the informers until ctx ends and returns once their caches are synced; serve
// Handler meanwhile (crdipc serves it with services.HTTPServer): /readyz says when it is.
func (a *Agent) Start(ctx context.Context) error {
	now := time.Now()
	if !a.start.CompareAndSwap(nil, &now) {
		return errors.New("metrics agent already started")
	}
	a.counter.start = now
	if _, err := a.events.AddEventHandler(a.counter); err != nil {
		return fmt.Errorf("adding event handler: %w", err)
	}
	for _, inf := range []cache.SharedIndexInformer{a.events, a.prs, a.branches} {
		go inf.RunWithContext(ctx)
	}
	if !cache.WaitForCacheSync(ctx.Done(), a.events.HasSynced, a.prs.HasSynced, a.branches.HasSynced) {
		return fmt.Errorf("waiting for caches to sync: %w", context.Cause(ctx))
	}
	a.opts.Logger.Info("metrics agent caches synced", "namespace", a.opts.Namespace, "took", time.Since(now).Round(time.Millisecond))
	return nil
}
