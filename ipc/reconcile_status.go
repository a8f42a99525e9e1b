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

// transition reports whether ready is news next to the status read before
// the handler ran: a new status or reason, or the first verdict on a new
// generation. Message-only changes (progress counts, retried error texts)
// are not transitions.
func transition(before conditions.Object, ready metav1.Condition) bool {
	return !sameVerdict(meta.FindStatusCondition(before.GetConditions(), conditions.TypeReady), ready)
}

// sameVerdict reports whether the Ready condition c states the verdict ready does: the
// same status and reason for the same generation (the message may differ).
func sameVerdict(c *metav1.Condition, ready metav1.Condition) bool {
	return c != nil && c.Status == ready.Status && c.Reason == ready.Reason && c.ObservedGeneration == ready.ObservedGeneration
}

// owedEvent is the Event for one Ready transition, kept from the moment the
// transition is decided until the Event is stored.
type owedEvent struct {
	uid   types.UID
	ready metav1.Condition // the transition: Ready as it will be stored
	typ   string
	note  string
}

// eventFor is the Event that reports ready on obj.
func (r *receiver[T]) eventFor(obj T, ready metav1.Condition, herr error) owedEvent {
	finished := ready.Status == metav1.ConditionTrue || conditions.IsTerminal(ready.Reason)
	typ := corev1.EventTypeNormal
	if herr != nil || finished && ready.Status == metav1.ConditionFalse || ready.Reason == conditions.ReasonDegraded {
		typ = corev1.EventTypeWarning
	}
	note := ready.Message
	if note == "" {
		note = "Ready=" + string(ready.Status)
	}
	return owedEvent{uid: obj.GetUID(), ready: ready, typ: typ, note: note}
}

// owedEventTimeout bounds the write of an owed Event once the receiver is stopping.
const owedEventTimeout = 5 * time.Second

// settle records the Event owed for key once obj, as stored, shows its
// transition. An Event whose transition is not (or not yet) in the stored
// status stays owed: the status write may still be in flight in the cache,
// or the handler will decide again and owe a new one. It fails only when the
// Event may not have been stored because the API server is away; the
// reconcile is then retried and settles it then.
func (r *receiver[T]) settle(ctx context.Context, key types.NamespacedName, obj T) error {
	v, ok := r.owed.Load(key)
	if !ok {
		return nil
	}
	e := v.(owedEvent)
	if e.uid != obj.GetUID() {
		r.owed.CompareAndDelete(key, v) // the request was deleted and created again
		return nil
	}
	// A later message-only change (progress counts) is the same transition.
	if !sameVerdict(meta.FindStatusCondition(obj.GetConditions(), conditions.TypeReady), e.ready) {
		return nil
	}
	// The status is stored: the Event is written even if the receiver is being stopped
	// meanwhile, within a bound, since a stopped receiver's owed Events are lost with it.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), owedEventTimeout)
	defer cancel()
	if err := r.events.record(ectx, obj, e.ready.ObservedGeneration, e.typ, e.ready.Reason, "Reconcile", e.note); err != nil {
		return err
	}
	r.owed.CompareAndDelete(key, v)
	return nil
}

// observe updates the metrics once the verdict is stored: the in-flight gauge,
// and on a transition to a finished state the request counters and age.
func (r *receiver[T]) observe(before, after T, ready metav1.Condition) {
	finished := ready.Status == metav1.ConditionTrue || conditions.IsTerminal(ready.Reason)
	r.track(after.GetUID(), !finished)
	if !transition(before, ready) {
		return
	}
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
