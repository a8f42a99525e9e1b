package ipc

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/crdipc/crdipc/api/conditions"
)

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
