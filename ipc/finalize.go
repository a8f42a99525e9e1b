package ipc

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crdipc/crdipc/api/conditions"
)

// deletingError is Finalize's "not yet": cleanup has begun but waits for something
// else, e.g. other objects to be deleted by their own receivers.
type deletingError struct {
	message      string
	requeueAfter time.Duration
}

func (e *deletingError) Error() string { return "deleting: " + e.message }

// Deleting is returned by Finalize when cleanup has begun but cannot finish yet, typically
// because it waits for other objects to go. It is not a failure: the finalizer stays,
// Ready becomes False with reason Deleting and this message (with an Event whenever the
// message changes), and Finalize is called again when a watched object changes (see
// Options.Watches) or, if requeueAfter is positive, after that long.
func Deleting(message string, requeueAfter time.Duration) error {
	return &deletingError{message: message, requeueAfter: requeueAfter}
}

func asDeleting(err error) (*deletingError, bool) {
	var d *deletingError
	ok := errors.As(err, &d)
	return d, ok
}

// setDeleting records on obj why its deletion is waiting.
func (r *receiver[T]) setDeleting(ctx context.Context, obj T, msg string) error {
	gen := obj.GetGeneration()
	before := obj.DeepCopyObject().(T)
	conds := obj.GetConditions()
	meta.SetStatusCondition(&conds, metav1.Condition{Type: conditions.TypeReady, Status: metav1.ConditionFalse, Reason: conditions.ReasonDeleting, Message: msg, ObservedGeneration: gen})
	meta.SetStatusCondition(&conds, metav1.Condition{Type: conditions.TypeProgressing, Status: metav1.ConditionTrue, Reason: conditions.ReasonDeleting, Message: msg, ObservedGeneration: gen})
	obj.SetConditions(conds)
	obj.SetObservedGeneration(gen)
	if equality.Semantic.DeepEqual(before, obj) {
		return nil
	}
	if err := r.c.Status().Update(ctx, obj); err != nil {
		return err
	}
	// The status says why deletion waits; the Event only echoes it.
	_ = r.events.record(ctx, obj, obj.GetGeneration(), corev1.EventTypeNormal, conditions.ReasonDeleting, "Finalize", msg)
	return nil
}
