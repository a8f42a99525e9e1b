package webhook

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
)

// deliveryIDField indexes records by X-GitHub-Delivery, in the cache and (a selectable field
// of the CRD) on the API server.
const deliveryIDField = "spec.deliveryID"

// RecordName is the name of the Delivery record of a raw webhook body: sha256-<hex digest>.
// The digest is of the bytes that were signed, so a captured body keeps its record whatever
// headers it is resent with.
func RecordName(body []byte) string {
	sum := sha256.Sum256(body)
	return "sha256-" + hex.EncodeToString(sum[:])
}

// lookupRecord returns the record named name, or nil when there is none. A complete record
// found in the cache is taken as it is: records are only deleted after the retention and their
// spec never changes. A miss, or a record still pending in the cache, is confirmed on a live
// read, because it leads to writes.
func (l *Listener) lookupRecord(ctx context.Context, name string) (*scmv1alpha1.Delivery, error) {
	key := client.ObjectKey{Namespace: l.opts.Namespace, Name: name}
	rec := &scmv1alpha1.Delivery{}
	if l.synced.Load() {
		err := l.cache.Get(ctx, key, rec)
		if err == nil && rec.Status.Result != "" {
			return rec, nil
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
	}
	err := l.client.Get(ctx, key, rec)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return rec, nil
}

// otherBody returns a record of a body other than name's received under delivery, if any.
// Once the cache is synced it answers, so a body sent under a reused delivery ID within
// the cache's lag (milliseconds) is not caught here; it is a signed GitHub body, deduplicated
// by its own record like any other.
func (l *Listener) otherBody(ctx context.Context, delivery, name string) (*scmv1alpha1.Delivery, error) {
	var list scmv1alpha1.DeliveryList
	opts := []client.ListOption{client.InNamespace(l.opts.Namespace), client.MatchingFields{deliveryIDField: delivery}}
	var err error
	if l.synced.Load() {
		err = l.cache.List(ctx, &list, opts...)
	} else {
		err = l.client.List(ctx, &list, opts...)
	}
	if err != nil {
		return nil, fmt.Errorf("listing delivery records of %s: %w", delivery, err)
	}
	for i := range list.Items {
		if r := &list.Items[i]; r.Name != name && r.Spec.DeliveryID == delivery {
			return r, nil
		}
	}
	return nil, nil
}

// answerFromRecord answers a body that has a record, or returns nil when the record is
// pending: an earlier attempt did not store everything, and this one completes it.
func answerFromRecord(rec *scmv1alpha1.Delivery, event, delivery string) *response {
	received := rec.Spec.ReceivedAt.UTC().Format(time.RFC3339)
	if rec.Spec.Event != event {
		// GitHub never sends one body as two events: this is a captured body replayed under a
		// header that is not signed.
		return fail(http.StatusConflict, resultConflict,
			"this body was received as a %q event (delivery %s at %s, deliveries/%s); X-GitHub-Event is not signed, so it is refused as another event",
			truncate(rec.Spec.Event, 64), rec.Spec.DeliveryID, received, rec.Name)
	}
	if rec.Status.Result == "" {
		return nil
	}
	msg := fmt.Sprintf("delivered before at %s (deliveries/%s): nothing written", received, rec.Name)
	if rec.Spec.DeliveryID != delivery {
		// Two webhooks on one repository can send one body under two IDs; a captured body
		// resent under a new ID looks the same. Either way it was processed once.
		msg = fmt.Sprintf("same body as delivery %s at %s (deliveries/%s): nothing written", rec.Spec.DeliveryID, received, rec.Name)
	}
	return &response{
		status:    http.StatusOK,
		Result:    resultDuplicate,
		Object:    rec.Status.Object,
		EventName: rec.Status.EventName,
		Message:   msg,
	}
}

// createRecord records that the body named name, received as event under delivery, is being
// processed. When the record exists already (a concurrent copy created it) it returns that
// one, with created false.
func (l *Listener) createRecord(ctx context.Context, name, event, delivery string, received time.Time) (rec *scmv1alpha1.Delivery, created bool, err error) {
	rec = &scmv1alpha1.Delivery{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: l.opts.Namespace,
			Labels:    map[string]string{"app.kubernetes.io/managed-by": "crdipc-webhook-listener"},
		},
		Spec: scmv1alpha1.DeliverySpec{DeliveryID: delivery, Event: event, ReceivedAt: metav1.NewTime(received)},
	}
	err = l.client.Create(ctx, rec)
	if err == nil {
		return rec, true, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, false, fmt.Errorf("recording delivery %s: %w", delivery, err)
	}
	rec = &scmv1alpha1.Delivery{}
	if err := l.client.Get(ctx, client.ObjectKey{Namespace: l.opts.Namespace, Name: name}, rec); err != nil {
		return nil, false, fmt.Errorf("reading delivery record %s: %w", name, err)
	}
	return rec, false, nil
}

// completeRecord writes what the delivery stored into its record's status. It is the last
// write of a delivery, so a record that says done never claims more than is stored. Of
// concurrent copies, the one that created the Event knows the result; the others found the
// Event already there (duplicate) and give way to it.
func (l *Listener) completeRecord(ctx context.Context, rec *scmv1alpha1.Delivery, s *stored, object, evName string) error {
	now := metav1.Now()
	status := scmv1alpha1.DeliveryStatus{
		Result:      scmv1alpha1.DeliveryResult(s.result),
		Object:      object,
		EventName:   evName,
		CompletedAt: &now,
	}
	key, first := client.ObjectKeyFromObject(rec), true
	return retry.RetryOnConflict(conflictBackoff, func() error {
		if !first {
			rec = &scmv1alpha1.Delivery{}
			if err := l.client.Get(ctx, key, rec); err != nil {
				return err
			}
		}
		first = false
		if r := rec.Status.Result; r != "" && (r != scmv1alpha1.DeliveryDuplicate || status.Result == scmv1alpha1.DeliveryDuplicate) {
			return nil
		}
		next := rec.DeepCopy()
		next.Status = status
		return l.client.Status().Update(ctx, next)
	})
}

// dropRecord deletes a record this attempt created for a delivery the API server refused for
// good, so that nothing is left of a refused delivery. Best effort: a record left behind is
// pending, and expires.
func (l *Listener) dropRecord(rec *scmv1alpha1.Delivery) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	uid := rec.UID
	if err := l.client.Delete(ctx, rec, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
		l.opts.Logger.Warn("deleting the record of a refused delivery", "record", rec.Name, "error", err)
	}
}

// collectRecords deletes the records older than the retention. Every replica runs it, at
// most once per interval; a delete is conditional on the version it saw, so a record that
// changed meanwhile is left to the next pass, and one already deleted is no error.
func (l *Listener) collectRecords(ctx context.Context) {
	var list scmv1alpha1.DeliveryList
	if err := l.cache.List(ctx, &list, client.InNamespace(l.opts.Namespace)); err != nil {
		l.opts.Logger.Warn("listing delivery records to expire", "error", err)
		return
	}
	cutoff := time.Now().Add(-l.opts.DeliveryRetention)
	for i := range list.Items {
		rec := &list.Items[i]
		if !rec.Spec.ReceivedAt.Time.Before(cutoff) {
			continue
		}
		uid, rv := rec.UID, rec.ResourceVersion
		err := l.client.Delete(ctx, rec, client.Preconditions{UID: &uid, ResourceVersion: &rv})
		switch {
		case err == nil:
			l.metrics.expired.Inc()
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		case ctx.Err() != nil:
			return
		default:
			l.opts.Logger.Warn("deleting an expired delivery record", "record", rec.Name, "error", err)
		}
	}
}
