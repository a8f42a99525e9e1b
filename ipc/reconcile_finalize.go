package ipc

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

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
