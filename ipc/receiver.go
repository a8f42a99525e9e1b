package ipc

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crdipc/crdipc/api/conditions"
)

// Handler serves one kind of request. Handle is called with the current
// object whenever its spec changes (and after errors, with backoff, and when
// a Result asks for it). It must be idempotent: after a crash it is called
// again for work it may already have done, so check before acting.
// Handle may set kind-specific status fields on obj; the receiver writes
// them together with the contract fields in one status update.
type Handler[T conditions.Object] interface {
	Handle(ctx context.Context, obj T) (Result, error)
}

// Finalizer is implemented by handlers that must clean up before their
// request disappears. The receiver then adds a finalizer to every request
// and removes it once Finalize returns nil; not-found while cleaning up
// should count as success. Finalize returns Deleting(…) to wait for
// something else without counting a failure.
type Finalizer[T conditions.Object] interface {
	Finalize(ctx context.Context, obj T) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc[T conditions.Object] func(ctx context.Context, obj T) (Result, error)

// Handle calls f.
func (f HandlerFunc[T]) Handle(ctx context.Context, obj T) (Result, error) { return f(ctx, obj) }

// Options configure a receiver. The zero value is usable.
type Options struct {
	// Name of the controller, in logs and controller-runtime metrics.
	// Default: the lower-case kind, e.g. "book".
	Name string
	// Finalizer added when the handler implements Finalizer.
	// Default: "crdipc.io/<name>".
	Finalizer string
	// OwnedEffects says that whatever Handle creates is owned by the request
	// (an owner reference to it), so that the garbage collector removes it
	// if the request is deleted before its finalizer is stored. The receiver
	// then stores a new request's finalizer while Handle runs instead of
	// before: the first reply waits for one write less. The status is still
	// written only once the finalizer is stored; if that fails, the
	// reconcile fails and is retried as any failed write.
	OwnedEffects bool
	// TTLAfterFinished deletes finished requests (Ready=True or a terminal
	// failure) this long after they finished. A request's own
	// spec.ttlSecondsAfterFinished takes precedence. Zero: never.
	TTLAfterFinished time.Duration
	// MaxConcurrentReconciles handles this many requests at once. Default 4.
	MaxConcurrentReconciles int
	// BackoffBase and BackoffMax bound the exponential retry delay after a
	// handler error. Defaults 100 ms and 5 min.
	BackoffBase, BackoffMax time.Duration
	// LeaseNamespace holds the heartbeat Lease; default DefaultLeaseNamespace.
	LeaseNamespace string
	// LeaseDuration is how long a heartbeat stays fresh; renewed every
	// third of it. Default 15 s. Negative disables the heartbeat.
	LeaseDuration time.Duration
	// Identity names this replica in the Lease; default hostname_uuid.
	Identity string
	// Watches are other kinds whose changes call the handler again for the
	// requests they map to (see Watch).
	Watches []Watch
	// TracerProvider traces each reconcile, as a child of the sender's span
	// (TraceParentAnnotation), with spans for the handler and the status
	// write. Default: the global provider (otel.GetTracerProvider).
	TracerProvider trace.TracerProvider
}

// Register adds a receiver for the kind of proto (a pointer to a crdipc
// type, e.g. &libraryv1alpha1.Book{}) to mgr.
func Register[T conditions.Object](mgr manager.Manager, proto T, h Handler[T], o Options) error {
	gvk, err := apiutil.GVKForObject(proto, mgr.GetScheme())
	if err != nil {
		return fmt.Errorf("registering receiver: %w", err)
	}
	if o.Name == "" {
		o.Name = strings.ToLower(gvk.Kind)
	}
	if o.Finalizer == "" {
		o.Finalizer = "crdipc.io/" + o.Name
	}
	if o.MaxConcurrentReconciles == 0 {
		o.MaxConcurrentReconciles = 4
	}
	if o.BackoffBase == 0 {
		o.BackoffBase = 100 * time.Millisecond
	}
	if o.BackoffMax == 0 {
		o.BackoffMax = 5 * time.Minute
	}
	if o.LeaseNamespace == "" {
		o.LeaseNamespace = DefaultLeaseNamespace
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = 15 * time.Second
	}
	if o.Identity == "" {
		host, _ := os.Hostname()
		o.Identity = host + "_" + string(uuid.NewUUID())
	}
	if o.TracerProvider == nil {
		o.TracerProvider = otel.GetTracerProvider()
	}
	r := &receiver[T]{
		kind:    gvk.Kind,
		typ:     reflect.TypeOf(proto).Elem(),
		c:       mgr.GetClient(),
		live:    mgr.GetAPIReader(),
		handler: h,
		opts:    o,
		tracer:  o.TracerProvider.Tracer(tracerName),
		events: &eventWriter{
			c:          mgr.GetClient(),
			scheme:     mgr.GetScheme(),
			controller: "crdipc.io/" + o.Name,
			instance:   o.Identity,
		},
	}
	// The gauge exists from the start, at 0, rather than from the first
	// pending request: "no series" would read as "no receiver".
	requestsInFlight.WithLabelValues(gvk.Kind)
	if f, ok := h.(Finalizer[T]); ok {
		r.finalizer = f
	}
	if o.LeaseDuration > 0 {
		if err := mgr.Add(&heartbeat{
			c:        mgr.GetClient(),
			r:        mgr.GetAPIReader(),
			key:      client.ObjectKey{Namespace: o.LeaseNamespace, Name: LeaseName(gvk.GroupKind())},
			identity: o.Identity,
			duration: o.LeaseDuration,
		}); err != nil {
			return fmt.Errorf("registering receiver heartbeat: %w", err)
		}
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named(o.Name).
		For(proto, builder.WithPredicates(requestChanged, r.queue.predicate()))
	return addWatches(b, o.Watches).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: o.MaxConcurrentReconciles,
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](o.BackoffBase, o.BackoffMax),
		}).
		Complete(r)
}

// requestChanged skips the update events caused by the receiver's own status
// writes: only a new generation, deletion or finalizer/annotation change
// needs the handler. A new trace context alone (a sender applying the same
// spec again) is not a change: the stored status already answers it.
var requestChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld, e.ObjectNew
		return o.GetGeneration() != n.GetGeneration() ||
			o.GetDeletionTimestamp().IsZero() != n.GetDeletionTimestamp().IsZero() ||
			!equality.Semantic.DeepEqual(o.GetFinalizers(), n.GetFinalizers()) ||
			!sameBesidesTraceContext(o.GetAnnotations(), n.GetAnnotations())
	},
}

// sameBesidesTraceContext compares two objects' annotations, leaving out the
// trace context ones.
func sameBesidesTraceContext(a, b map[string]string) bool {
	for k, v := range a {
		if bv, ok := b[k]; !isTraceAnnotation(k) && (!ok || bv != v) {
			return false
		}
	}
	for k := range b {
		if _, ok := a[k]; !isTraceAnnotation(k) && !ok {
			return false
		}
	}
	return true
}

// receiver is the reconciler Register builds for one kind. Reconcile reads the request and
// finalizes it when it is being deleted; otherwise it adds the finalizer (when the handler
// has one), deletes the request when its TTL after finishing has passed, or calls the
// handler and writes the status contract for its verdict, reporting Ready transitions as
// Events and metrics.
type receiver[T conditions.Object] struct {
	kind      string
	typ       reflect.Type
	c         client.Client
	live      client.Reader // the API server, for when the cache is behind
	handler   Handler[T]
	finalizer Finalizer[T]
	opts      Options
	tracer    trace.Tracer
	events    *eventWriter
	queue     queueWait
	inFlight  sync.Map // types.UID → struct{}: the requests the in-flight gauge counts (see track)
	owed      sync.Map // types.NamespacedName → owedEvent: Events of transitions not yet recorded (see settle)
	away      awayBackoff
}

func (r *receiver[T]) newObject() T { return reflect.New(r.typ).Interface().(T) }

func logFromContext(ctx context.Context) logr.Logger { return log.FromContext(ctx) }
