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
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
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
	r := &receiver[T]{
		kind:    gvk.Kind,
		typ:     reflect.TypeOf(proto).Elem(),
		c:       mgr.GetClient(),
		live:    mgr.GetAPIReader(),
		handler: h,
		opts:    o,
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
		For(proto, builder.WithPredicates(requestChanged))
	return addWatches(b, o.Watches).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: o.MaxConcurrentReconciles,
			RateLimiter:             workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](o.BackoffBase, o.BackoffMax),
		}).
		Complete(r)
}

// requestChanged skips the update events caused by the receiver's own status
// writes: only a new generation, deletion or finalizer/annotation change
// needs the handler.
var requestChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld, e.ObjectNew
		return o.GetGeneration() != n.GetGeneration() ||
			o.GetDeletionTimestamp().IsZero() != n.GetDeletionTimestamp().IsZero() ||
			!equality.Semantic.DeepEqual(o.GetFinalizers(), n.GetFinalizers()) ||
			!equality.Semantic.DeepEqual(o.GetAnnotations(), n.GetAnnotations())
	},
}

type receiver[T conditions.Object] struct {
	kind      string
	typ       reflect.Type
	c         client.Client
	live      client.Reader // the API server, for when the cache is behind
	handler   Handler[T]
	finalizer Finalizer[T]
	opts      Options
	events    *eventWriter
	inFlight  sync.Map // types.UID → struct{}
}

func (r *receiver[T]) newObject() T { return reflect.New(r.typ).Interface().(T) }

func (r *receiver[T]) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	res, err := r.reconcile(ctx, req, r.c)
	if apierrors.IsConflict(err) {
		// The cached object was older than the stored one, most often because the
		// cache had not yet seen this receiver's own write of a moment ago. Going again
		// at once from the API server costs one read; waiting for the cache costs a
		// requeue, which measured as the largest single delay in a volume's round trip.
		res, err = r.reconcile(ctx, req, r.live)
	}
	if err != nil && ctx.Err() != nil {
		// Stopping: the request stays as stored and the next start takes it up; the
		// cancelled calls are not errors worth reporting.
		return reconcile.Result{}, nil
	}
	return conflictRequeue(res, err)
}

// reconcile reads the request through reader and handles it. A conflict on the
// finalizer or status write is returned as is, for Reconcile to decide.
func (r *receiver[T]) reconcile(ctx context.Context, req reconcile.Request, reader client.Reader) (reconcile.Result, error) {
	obj := r.newObject()
	if err := reader.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if !obj.GetDeletionTimestamp().IsZero() {
		r.track(obj.GetUID(), false)
		return r.finalize(ctx, obj)
	}
	if r.finalizer != nil && !controllerutil.ContainsFinalizer(obj, r.opts.Finalizer) {
		base := obj.DeepCopyObject().(T)
		controllerutil.AddFinalizer(obj, r.opts.Finalizer)
		if err := r.c.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return reconcile.Result{}, err
		}
	}
	if res, done, err := r.expire(ctx, obj); done {
		return res, err
	}

	before := obj.DeepCopyObject().(T)
	res, herr := r.handler.Handle(ctx, obj)
	ready := r.setConditions(obj, res, herr)
	if !equality.Semantic.DeepEqual(before, obj) {
		if err := r.c.Status().Update(ctx, obj); err != nil {
			return reconcile.Result{}, err
		}
	}
	r.observe(ctx, before, obj, ready, herr)

	if t, ok := asTerminal(herr); ok {
		log.FromContext(ctx).Info("request failed", "reason", t.reason, "message", t.message)
		return r.ttlRequeue(obj), nil
	}
	if herr != nil {
		requestErrorsTotal.WithLabelValues(r.kind).Inc()
		return reconcile.Result{}, herr
	}
	if ready.Status == metav1.ConditionTrue {
		return minRequeue(r.ttlRequeue(obj), res.RequeueAfter), nil
	}
	return reconcile.Result{RequeueAfter: res.RequeueAfter}, nil
}

// setConditions writes the contract fields for the handler's verdict and
// returns the new Ready condition.
func (r *receiver[T]) setConditions(obj T, res Result, herr error) metav1.Condition {
	gen := obj.GetGeneration()
	ready := metav1.Condition{Type: conditions.TypeReady, ObservedGeneration: gen}
	progressing := metav1.Condition{Type: conditions.TypeProgressing, ObservedGeneration: gen}
	t, terminal := asTerminal(herr)
	switch {
	case terminal:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, t.reason, t.message
		progressing.Status, progressing.Reason, progressing.Message = metav1.ConditionFalse, t.reason, "the receiver will not retry this generation"
	case herr != nil:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, conditions.ReasonReconciling, "retrying after error: "+herr.Error()
		progressing.Status, progressing.Reason, progressing.Message = metav1.ConditionTrue, conditions.ReasonReconciling, ready.Message
	case res.Ready:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, conditions.ReasonSucceeded, res.Message
		progressing.Status, progressing.Reason, progressing.Message = metav1.ConditionFalse, conditions.ReasonSucceeded, "done"
	default:
		reason := res.Reason
		if reason == "" {
			reason = conditions.ReasonReconciling
		}
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, reason, res.Message
		progressing.Status, progressing.Reason, progressing.Message = metav1.ConditionTrue, reason, res.Message
	}
	conds := obj.GetConditions()
	meta.SetStatusCondition(&conds, ready)
	meta.SetStatusCondition(&conds, progressing)
	obj.SetConditions(conds)
	obj.SetObservedGeneration(gen)
	return ready
}

// observe emits the Event and metrics for a Ready transition: a new status
// or reason, or the first verdict on a new generation. Message-only changes
// (progress counts, retried error texts) are not transitions.
func (r *receiver[T]) observe(ctx context.Context, before, after T, ready metav1.Condition, herr error) {
	finished := ready.Status == metav1.ConditionTrue || conditions.IsTerminal(ready.Reason)
	r.track(after.GetUID(), !finished)
	old := meta.FindStatusCondition(before.GetConditions(), conditions.TypeReady)
	if old != nil && old.Status == ready.Status && old.Reason == ready.Reason && old.ObservedGeneration == ready.ObservedGeneration {
		return
	}
	typ := corev1.EventTypeNormal
	if herr != nil || finished && ready.Status == metav1.ConditionFalse || ready.Reason == conditions.ReasonDegraded {
		typ = corev1.EventTypeWarning
	}
	note := ready.Message
	if note == "" {
		note = "Ready=" + string(ready.Status)
	}
	r.events.record(ctx, after, typ, ready.Reason, "Reconcile", note)
	switch {
	case ready.Status == metav1.ConditionTrue:
		requestsTotal.WithLabelValues(r.kind, "succeeded").Inc()
		if after.GetGeneration() == 1 {
			requestDuration.WithLabelValues(r.kind).Observe(time.Since(after.GetCreationTimestamp().Time).Seconds())
		}
	case finished:
		requestsTotal.WithLabelValues(r.kind, "failed").Inc()
	}
}

// track keeps the in-flight gauge: +1 when a request is first seen
// unfinished, -1 when it finishes or goes, without counting the whole set on
// every reconcile.
func (r *receiver[T]) track(uid types.UID, pending bool) {
	if pending {
		if _, known := r.inFlight.LoadOrStore(uid, struct{}{}); !known {
			requestsInFlight.WithLabelValues(r.kind).Inc()
		}
	} else if _, known := r.inFlight.LoadAndDelete(uid); known {
		requestsInFlight.WithLabelValues(r.kind).Dec()
	}
}

func (r *receiver[T]) finalize(ctx context.Context, obj T) (reconcile.Result, error) {
	if r.finalizer == nil || !controllerutil.ContainsFinalizer(obj, r.opts.Finalizer) {
		return reconcile.Result{}, nil
	}
	if err := r.finalizer.Finalize(ctx, obj); err != nil {
		if d, ok := asDeleting(err); ok {
			if err := r.setDeleting(ctx, obj, d.message); err != nil && !apierrors.IsNotFound(err) {
				return conflictRequeue(reconcile.Result{}, err)
			}
			return reconcile.Result{RequeueAfter: d.requeueAfter}, nil
		}
		if ctx.Err() != nil {
			return reconcile.Result{}, err // stopping: Reconcile drops it
		}
		r.events.record(ctx, obj, corev1.EventTypeWarning, "CleanupFailed", "Finalize", "cleanup failed, retrying: "+err.Error())
		requestErrorsTotal.WithLabelValues(r.kind).Inc()
		return reconcile.Result{}, err
	}
	base := obj.DeepCopyObject().(T)
	controllerutil.RemoveFinalizer(obj, r.opts.Finalizer)
	if err := r.c.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
		return conflictRequeue(reconcile.Result{}, err)
	}
	return reconcile.Result{}, nil
}

// ttl is how long a finished request is kept, or 0 to keep it.
func (r *receiver[T]) ttl(obj T) time.Duration {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err == nil {
		if s, found, _ := unstructured.NestedInt64(u, "spec", "ttlSecondsAfterFinished"); found {
			if s == 0 {
				return time.Nanosecond // 0 means "right away", as for Jobs
			}
			return time.Duration(s) * time.Second
		}
	}
	return r.opts.TTLAfterFinished
}

// finishedAt returns when the current generation finished, if it has.
func finishedAt(obj conditions.Object) (time.Time, bool) {
	c := meta.FindStatusCondition(obj.GetConditions(), conditions.TypeReady)
	if c == nil || obj.GetObservedGeneration() < obj.GetGeneration() || c.ObservedGeneration < obj.GetGeneration() {
		return time.Time{}, false
	}
	if c.Status == metav1.ConditionTrue || conditions.IsTerminal(c.Reason) {
		// LastTransitionTime is stored with second precision (truncated):
		// the true time lies within the following second. Taking its end
		// means a TTL may expire up to a second late, never early.
		return c.LastTransitionTime.Add(time.Second), true
	}
	return time.Time{}, false
}

// expire deletes a request whose TTL after finishing has passed.
func (r *receiver[T]) expire(ctx context.Context, obj T) (reconcile.Result, bool, error) {
	// finishedAt is cheap; the TTL lookup converts the object, so only
	// finished requests pay for it.
	at, finished := finishedAt(obj)
	if !finished {
		return reconcile.Result{}, false, nil
	}
	ttl := r.ttl(obj)
	if ttl == 0 {
		return reconcile.Result{}, false, nil
	}
	if left := time.Until(at.Add(ttl)); left > 0 {
		return reconcile.Result{}, false, nil
	}
	// The preconditions make sure we delete exactly the finished object we
	// read, not a newer generation someone just wrote.
	uid, rv := obj.GetUID(), obj.GetResourceVersion()
	err := r.c.Delete(ctx, obj, client.Preconditions{UID: &uid, ResourceVersion: &rv}, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if err != nil && !apierrors.IsNotFound(err) {
		res, err := conflictRequeue(reconcile.Result{}, err)
		return res, true, err
	}
	r.track(uid, false)
	return reconcile.Result{}, true, nil
}

func (r *receiver[T]) ttlRequeue(obj T) reconcile.Result {
	at, finished := finishedAt(obj)
	if !finished {
		return reconcile.Result{}
	}
	ttl := r.ttl(obj)
	if ttl == 0 {
		return reconcile.Result{}
	}
	return reconcile.Result{RequeueAfter: max(time.Until(at.Add(ttl)), time.Millisecond)}
}

func minRequeue(a reconcile.Result, b time.Duration) reconcile.Result {
	if b > 0 && (a.RequeueAfter == 0 || b < a.RequeueAfter) {
		a.RequeueAfter = b
	}
	return a
}

// conflictRequeue turns an optimistic-concurrency conflict into a quick,
// quiet retry: the cache delivers the newer object within milliseconds, and
// the error backoff (100 ms and up) would dominate a request's latency.
func conflictRequeue(res reconcile.Result, err error) (reconcile.Result, error) {
	if apierrors.IsConflict(err) {
		return reconcile.Result{RequeueAfter: 10 * time.Millisecond}, nil
	}
	return res, err
}

func logFromContext(ctx context.Context) logr.Logger { return log.FromContext(ctx) }
