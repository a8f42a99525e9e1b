package ipc

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crdipc/crdipc/api/conditions"
)

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
