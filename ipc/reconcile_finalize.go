package ipc

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// addFinalizer starts storing the receiver's finalizer on a copy of obj and returns a
// function that waits for that write. Once it has succeeded, the function gives each
// object passed to it the stored finalizers and resourceVersion, so that the status write
// that follows is checked against the object as stored. The write is waited for before
// the handler runs, so that nothing the handler does can outlive the request unnoticed,
// or after it (Options.OwnedEffects); the function may be called more than once.
func (r *receiver[T]) addFinalizer(ctx context.Context, obj T) func(...T) error {
	base := obj.DeepCopyObject().(T)
	stored := obj.DeepCopyObject().(T)
	controllerutil.AddFinalizer(stored, r.opts.Finalizer)
	done := make(chan error, 1)
	go func() {
		done <- r.c.Patch(ctx, stored, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	}()
	wait := sync.OnceValue(func() error { return <-done })
	return func(objs ...T) error {
		if err := wait(); err != nil {
			return err
		}
		for _, o := range objs {
			o.SetFinalizers(stored.GetFinalizers())
			o.SetResourceVersion(stored.GetResourceVersion())
		}
		return nil
	}
}

// finalize cleans up a request that is being deleted: it calls the handler's Finalize and
// removes the finalizer once that succeeds. A Deleting(…) answer keeps the finalizer and
// records why in the status; it is not counted as an error.
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
		// The failure is retried, and reported again if it persists.
		_ = r.events.record(ctx, obj, obj.GetGeneration(), corev1.EventTypeWarning, "CleanupFailed", "Finalize", "cleanup failed, retrying: "+err.Error())
		requestErrorsTotal.WithLabelValues(r.kind).Inc()
		return reconcile.Result{}, handlerError{err}
	}
	base := obj.DeepCopyObject().(T)
	controllerutil.RemoveFinalizer(obj, r.opts.Finalizer)
	if err := r.c.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
		return conflictRequeue(reconcile.Result{}, err)
	}
	return reconcile.Result{}, nil
}
