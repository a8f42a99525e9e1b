package console

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/scm/webhook"
	"github.com/crdipc/crdipc/internal/tracing"
	"github.com/crdipc/crdipc/ipc"
)

//go:embed assets
var assets embed.FS

// MinInterval is the shortest time between two snapshots sent to browsers: changes that come
// faster are coalesced into the next one (≤ 5 updates/s).
const MinInterval = 200 * time.Millisecond

// maxClients bounds the browsers connected at once; each holds at most one pending snapshot.
const maxClients = 64

// heartbeat is how often an idle event stream gets a comment, so a vanished browser is
// noticed (the write fails) and proxies do not time the stream out.
const heartbeat = 15 * time.Second

// Options configure a Console.
type Options struct {
	// Config reaches the API server; the console only reads (get, list, watch).
	Config *rest.Config
	// Logger receives the few things that go wrong (a snapshot that cannot be built).
	Logger logr.Logger
	// Traces, when set, serves GET /traces and the page's waterfalls; nil turns them off
	// (as does a nil *tracing.Store).
	Traces TraceSource
	// Spans, when set, serves POST /v1/traces: an OTLP/HTTP receiver (up's:
	// tracing.Store.OTLPHandler), so that other processes' spans, `crdipc call`'s among
	// them, join the traces the page shows. A process points its OTLP exporter at the
	// console's address.
	Spans http.Handler
}

// Console watches the cluster and serves the page and its event stream. It is an
// http.Handler; Start runs its informers.
type Console struct {
	log      logr.Logger
	cache    cache.Cache
	tracker  *tracker
	hub      *hub
	dirty    chan struct{}
	files    http.Handler
	interval time.Duration
	traces   TraceSource  // nil: tracing off
	spans    http.Handler // nil: no OTLP receiver
}

// New builds a console reading through cfg. Nothing is watched until Start.
func New(o Options) (*Console, error) {
	if o.Config == nil {
		return nil, errors.New("console: no rest config")
	}
	c, err := cache.New(o.Config, cache.Options{
		Scheme: scheme.Scheme,
		// The console never reads managedFields; dropping them roughly halves what it keeps.
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			// Only the Events the webhook listener writes, one per delivery: the others
			// (every controller's) would be most of the cache and are not shown.
			&corev1.Event{}: {Field: fields.OneTermEqualSelector("source", webhook.ReportingController)},
			// Books are the kind that grows to 100,000s; the console only times them.
			&libraryv1alpha1.Book{}: {Transform: slimBook},
		},
	})
	if err != nil {
		return nil, fmt.Errorf("console: creating cache: %w", err)
	}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	con := &Console{
		log:      o.Logger,
		cache:    c,
		tracker:  newTracker(),
		hub:      newHub(),
		dirty:    make(chan struct{}, 1),
		files:    http.FileServerFS(static),
		interval: MinInterval,
		traces:   o.Traces,
		spans:    o.Spans,
	}
	if s, ok := o.Traces.(*tracing.Store); ok && s == nil {
		// up holds a nil store when tracing is off; in the interface it would not be nil.
		con.traces = nil
	}
	if err := con.watch(context.Background()); err != nil {
		return nil, err
	}
	return con, nil
}

// watch registers an informer for every kind the page shows. Request kinds also feed the
// tracker, which needs to see each transition to time it.
func (c *Console) watch(ctx context.Context) error {
	for _, k := range requestKinds {
		inf, err := c.cache.GetInformer(ctx, k.newObject())
		if err != nil {
			return fmt.Errorf("console: watching %s: %w", k.kind, err)
		}
		kind := k.kind
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(obj any, initial bool) {
				if o, ok := obj.(conditions.Object); ok {
					c.tracker.observe(kind, o, initial, time.Now())
				}
				c.poke()
			},
			UpdateFunc: func(_, obj any) {
				if o, ok := obj.(conditions.Object); ok {
					c.tracker.observe(kind, o, false, time.Now())
				}
				c.poke()
			},
			DeleteFunc: func(obj any) {
				if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
					obj = d.Obj
				}
				if o, ok := obj.(client.Object); ok {
					c.tracker.forget(o.GetUID())
				}
				c.poke()
			},
		}); err != nil {
			return fmt.Errorf("console: watching %s: %w", k.kind, err)
		}
	}
	for _, obj := range watchedKinds() {
		inf, err := c.cache.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("console: watching %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { c.poke() },
			UpdateFunc: func(_, _ any) { c.poke() },
			DeleteFunc: func(any) { c.poke() },
		}); err != nil {
			return fmt.Errorf("console: watching %T: %w", obj, err)
		}
	}
	return nil
}

// slimBook keeps of a Book what the tracker reads: its identity, generation, creation time,
// trace context and Ready condition.
func slimBook(obj any) (any, error) {
	b, ok := obj.(*libraryv1alpha1.Book)
	if !ok {
		return obj, nil // a tombstone: its object was slimmed when it was cached
	}
	slim := &libraryv1alpha1.Book{
		TypeMeta: b.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Namespace: b.Namespace, Name: b.Name, UID: b.UID, ResourceVersion: b.ResourceVersion,
			Generation: b.Generation, CreationTimestamp: b.CreationTimestamp, DeletionTimestamp: b.DeletionTimestamp,
		},
		Status: libraryv1alpha1.BookStatus{ObservedGeneration: b.Status.ObservedGeneration},
	}
	slim.Annotations = ipc.TraceContextAnnotations(b)
	if c := meta.FindStatusCondition(b.Status.Conditions, conditions.TypeReady); c != nil {
		slim.Status.Conditions = []metav1.Condition{*c}
	}
	return slim, nil
}

// poke marks the state changed; the publisher coalesces pokes.
func (c *Console) poke() {
	select {
	case c.dirty <- struct{}{}:
	default:
	}
}

// Start runs the informers and sends snapshots until ctx ends. It returns an error if the
// informers cannot sync.
func (c *Console) Start(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- c.cache.Start(ctx) }()
	if !c.cache.WaitForCacheSync(ctx) {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("console: informer caches did not sync: %w", <-errc)
	}
	c.poke()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return <-errc
		case <-c.dirty:
		}
		if wait := c.interval - time.Since(last); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return <-errc
			case <-t.C:
			}
		}
		// Changes during the wait are in this snapshot: drop their poke.
		select {
		case <-c.dirty:
		default:
		}
		last = time.Now()
		s, err := build(ctx, c.cache, c.tracker, last)
		if err != nil {
			c.log.Error(err, "building console snapshot")
			continue
		}
		s.Tracing = c.traces != nil
		b, err := json.Marshal(s)
		if err != nil {
			c.log.Error(err, "encoding console snapshot")
			continue
		}
		c.hub.publish(b)
	}
}

// ServeHTTP serves the page and its assets, GET /events (server-sent events: one JSON
// snapshot per message), GET /state (the latest snapshot, for curl and scripts), and
// GET /traces and /traces/<trace id> (see serveTraces), and with Options.Spans POST
// /v1/traces (OTLP/HTTP).
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/traces" || strings.HasPrefix(r.URL.Path, "/traces/") {
		c.serveTraces(w, r)
		return
	}
	switch r.URL.Path {
	case "/v1/traces":
		if c.spans == nil {
			http.Error(w, "console: no OTLP receiver (tracing is off)", http.StatusNotFound)
			return
		}
		c.spans.ServeHTTP(w, r)
	case "/events":
		c.serveEvents(w, r)
	case "/state":
		b := c.hub.latest()
		if b == nil {
			http.Error(w, "console: not synced yet", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(b)
	default:
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		c.files.ServeHTTP(w, r)
	}
}

func (c *Console) serveEvents(w http.ResponseWriter, r *http.Request) {
	ch, cancel, ok := c.hub.subscribe()
	if !ok {
		http.Error(w, "console: too many clients", http.StatusServiceUnavailable)
		return
	}
	defer cancel()
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	// retry: how soon EventSource reconnects after up restarts.
	if _, err := fmt.Fprint(w, "retry: 1000\n\n"); err != nil {
		return
	}
	if err := rc.Flush(); err != nil {
		return
	}
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		var err error
		select {
		case <-r.Context().Done():
			return
		case b := <-ch:
			_, err = fmt.Fprintf(w, "data: %s\n\n", b)
		case <-tick.C:
			_, err = fmt.Fprint(w, ": ping\n\n")
		}
		if err == nil {
			err = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

// hub fans snapshots out to browsers. Each subscriber has a one-slot channel that always
// holds the newest snapshot not yet sent: a slow browser skips intermediate states.
type hub struct {
	mu   sync.Mutex
	last []byte
	subs map[chan []byte]struct{}
}

func newHub() *hub { return &hub{subs: map[chan []byte]struct{}{}} }

func (h *hub) publish(b []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if string(b) == string(h.last) {
		return
	}
	h.last = b
	for ch := range h.subs {
		select {
		case <-ch: // replace the unsent older snapshot
		default:
		}
		ch <- b
	}
}

func (h *hub) latest() []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last
}

// subscribe returns a channel that receives the current snapshot (if any) and every later
// one, and a function that ends the subscription; ok is false when maxClients are connected.
func (h *hub) subscribe() (_ <-chan []byte, cancel func(), ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) >= maxClients {
		return nil, nil, false
	}
	ch := make(chan []byte, 1)
	if h.last != nil {
		ch <- h.last
	}
	h.subs[ch] = struct{}{}
	return ch, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs, ch)
	}, true
}
