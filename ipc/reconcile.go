package ipc

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

func (r *receiver[T]) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	wait := queued{since: r.queue.take(req.NamespacedName), until: time.Now()}
	res, err := r.reconcile(ctx, req, r.c, wait)
	if apierrors.IsConflict(err) {
		// The cached object was older than the stored one, most often because the
		// cache had not yet seen this receiver's own write of a moment ago. Going again
		// at once from the API server costs one read; waiting for the cache costs a
		// requeue, which measured as the largest single delay in a volume's round trip.
		res, err = r.reconcile(ctx, req, r.live, queued{})
	}
	if err != nil && ctx.Err() != nil {
		// Stopping: the request stays as stored and the next start takes it up; the
		// cancelled calls are not errors worth reporting.
		return reconcile.Result{}, nil
	}
	var herr handlerError
	if err != nil && !errors.As(err, &herr) && transient(err) {
		// The receiver's own reads and writes failed: the API server is away
		// (restarting, overloaded). The per-request exponential backoff, meant for
		// failing handlers, would keep each pending request waiting after an outage
		// about as long again as the outage lasted; retry at the pace senders do
		// instead, one backoff for the whole receiver.
		log.FromContext(ctx).V(1).Info("API server unavailable, retrying", "error", err.Error())
		return reconcile.Result{RequeueAfter: r.away.next()}, nil
	}
	if err == nil {
		r.away.reset()
	}
	return conflictRequeue(res, err)
}

// handlerError marks a failure of the handler or finalizer, which is retried
// with the exponential backoff of Options; the receiver's own API calls are
// not (see Reconcile).
type handlerError struct{ error }

func (e handlerError) Unwrap() error { return e.error }

// awayBackoff paces a receiver's retries while the API server is away: it
// grows with each failure as a sender's does (newBackoff) and starts over
// once a reconcile succeeds.
type awayBackoff struct {
	mu sync.Mutex
	b  *wait.Backoff
}

func (a *awayBackoff) next() time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.b == nil {
		a.b = newBackoff()
	}
	return a.b.Step()
}

func (a *awayBackoff) reset() {
	a.mu.Lock()
	a.b = nil
	a.mu.Unlock()
}

// queued is the time a request waited in the workqueue, when a watch event queued it.
type queued struct{ since, until time.Time }

// reconcile reads the request through reader and handles it. A conflict on the
// finalizer or status write is returned as is, for Reconcile to decide. The
// reconcile's span starts when the request was queued, with the wait for a
// worker as its first child, so that the time from the write to the reply is
// all in the trace.
func (r *receiver[T]) reconcile(ctx context.Context, req reconcile.Request, reader client.Reader, wait queued) (reconcile.Result, error) {
	obj := r.newObject()
	if err := reader.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			r.owed.Delete(req.NamespacedName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	var opts []trace.SpanStartOption
	if !wait.since.IsZero() {
		opts = append(opts, trace.WithTimestamp(wait.since))
	}
	ctx, span := startSpan(ctx, r.tracer, "reconcile "+r.kind, []client.Object{obj}, opts...)
	if !wait.since.IsZero() && span.IsRecording() {
		_, w := r.tracer.Start(ctx, "queue wait", trace.WithTimestamp(wait.since))
		w.End(trace.WithTimestamp(wait.until))
	}
	res, err := r.serve(ctx, req, obj)
	EndSpan(span, err)
	return res, err
}

// serve handles the request obj, as read for req.
func (r *receiver[T]) serve(ctx context.Context, req reconcile.Request, obj T) (reconcile.Result, error) {
	// An Event owed for a transition whose status write's outcome was unknown, or
	// whose own write failed: written once the stored status shows the transition.
	if err := r.settle(ctx, req.NamespacedName, obj); err != nil {
		return reconcile.Result{}, err
	}
	if !obj.GetDeletionTimestamp().IsZero() {
		r.track(obj.GetUID(), false)
		return r.finalize(ctx, obj)
	}
	// finalized waits for the finalizer write, if one was needed, and brings its outcome
	// into the objects it is given: before the handler runs, or with OwnedEffects after.
	finalized := func(...T) error { return nil }
	if r.finalizer != nil && !controllerutil.ContainsFinalizer(obj, r.opts.Finalizer) {
		finalized = r.addFinalizer(ctx, obj)
		if !r.opts.OwnedEffects {
			if err := finalized(obj); err != nil {
				return reconcile.Result{}, err
			}
		}
	}
	if res, done, err := r.expire(ctx, obj); done {
		if ferr := finalized(obj); ferr != nil {
			return reconcile.Result{}, ferr
		}
		return res, err
	}

	before := obj.DeepCopyObject().(T)
	hctx, hspan := r.tracer.Start(ctx, "handle "+r.kind)
	res, herr := r.handler.Handle(hctx, obj)
	EndSpan(hspan, herr)
	if err := finalized(obj, before); err != nil {
		return reconcile.Result{}, err
	}
	if herr == nil && !res.Ready && res.HoldStatus > 0 && before.GetObservedGeneration() < before.GetGeneration() {
		// The handler's progress report is about to be overtaken (see Result.HoldStatus).
		// Only while the stored status has no verdict on this generation yet: a hold
		// never leaves a verdict standing that the handler has just found out of date.
		r.track(obj.GetUID(), true)
		return minRequeue(reconcile.Result{RequeueAfter: res.HoldStatus}, res.RequeueAfter), nil
	}
	ready := r.setConditions(obj, res, herr)
	// The status goes first and the Event after it, so that an Event never reports a
	// transition that was not stored, and the sender, who waits for the status, does
	// not wait for the Event too. The Event is owed from here until it is written: if
	// the status write fails or its response is lost, a retry may find the transition
	// already stored and so see none to report; it then writes the owed Event (settle).
	if transition(before, ready) {
		r.owed.Store(req.NamespacedName, r.eventFor(obj, ready, herr))
	}
	if !equality.Semantic.DeepEqual(before, obj) {
		sctx, sspan := r.tracer.Start(ctx, "write status")
		err := r.c.Status().Update(sctx, obj)
		EndSpan(sspan, err)
		if err != nil {
			return reconcile.Result{}, err
		}
	}
	r.observe(before, obj, ready)
	if err := r.settle(ctx, req.NamespacedName, obj); err != nil {
		return reconcile.Result{}, err
	}

	if t, ok := asTerminal(herr); ok {
		log.FromContext(ctx).Info("request failed", "reason", t.reason, "message", t.message)
		return r.ttlRequeue(obj), nil
	}
	if herr != nil {
		requestErrorsTotal.WithLabelValues(r.kind).Inc()
		return reconcile.Result{}, handlerError{herr}
	}
	if ready.Status == metav1.ConditionTrue {
		return minRequeue(r.ttlRequeue(obj), res.RequeueAfter), nil
	}
	return reconcile.Result{RequeueAfter: res.RequeueAfter}, nil
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
