package webhook

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
)

// errRecordGone: the record was deleted while being completed (it expired).
var errRecordGone = errors.New("delivery record deleted meanwhile")

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

// knownRecord returns the record named name as the listener knows it, or nil. Once the cache is
// synced it answers, without a read of the API server: records are only deleted after the
// retention, and a complete record never changes. A miss (a record created within the
// cache's lag, milliseconds) leads to the idempotent writes, and the record's create then
// meets the record and decides (saveRecord). Without a synced cache the record is read live,
// as every read is.
func (l *Listener) knownRecord(ctx context.Context, name string) (*scmv1alpha1.Delivery, error) {
	key := client.ObjectKey{Namespace: l.opts.Namespace, Name: name}
	rec := &scmv1alpha1.Delivery{}
	var err error
	if l.synced.Load() {
		err = l.cache.Get(ctx, key, rec)
	} else {
		err = l.client.Get(ctx, key, rec)
	}
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return rec, nil
}

// otherBody returns a record of a body other than name's received under delivery, if any.
// Once the cache is synced it answers, so a body sent under a reused delivery ID while the
// first body is being stored, or within the cache's lag after (milliseconds), is not caught
// here; it is a signed GitHub body, deduplicated by its own record like any other.
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
// pending (left so by an earlier listener, which created it before storing anything): that
// attempt did not store everything, and this one completes it.
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

// saveRecord writes want, the complete record of a delivery whose object and Event are stored.
// It is the last write of a delivery, so a record never claims more than is stored; it is
// created complete, in one write. found is the record the listener knew before storing, nil
// if none: a record found pending (left by an earlier listener) is completed instead.
//
// When a record is there already that this call did not complete (a concurrent copy of the
// body wrote it first, an earlier attempt did and the cache had not seen it yet, or the body
// was received as another event) saveRecord returns it and writes nothing. That is the only
// read of a record on the API server, and it is off the happy path.
func (l *Listener) saveRecord(ctx context.Context, found, want *scmv1alpha1.Delivery) (*scmv1alpha1.Delivery, error) {
	key := client.ObjectKeyFromObject(want)
	cur, reread := found, false
	var existing *scmv1alpha1.Delivery
	// read reads the record again; errRecordGone: it was deleted meanwhile (expired), create it.
	read := func() error {
		cur = &scmv1alpha1.Delivery{}
		err := l.client.Get(ctx, key, cur)
		if err != nil {
			cur = nil
		}
		if apierrors.IsNotFound(err) {
			return errRecordGone
		}
		return err
	}
	err := retry.OnError(conflictBackoff, func(err error) bool {
		return apierrors.IsConflict(err) || errors.Is(err, errRecordGone)
	}, func() error {
		if reread {
			if err := read(); err != nil {
				return err
			}
			reread = false
		}
		if cur == nil {
			err := l.client.Create(ctx, want.DeepCopy())
			if !apierrors.IsAlreadyExists(err) {
				return err
			}
			if err := read(); err != nil {
				return err
			}
		}
		if cur.Status.Result != "" || cur.Spec.Event != want.Spec.Event {
			existing = cur
			return nil
		}
		// Pending, left by an earlier listener: complete it. Its spec stays as it is.
		next := cur.DeepCopy()
		next.Status = want.Status
		err := l.client.Update(ctx, next)
		if apierrors.IsNotFound(err) {
			cur = nil
			return errRecordGone
		}
		reread = err != nil
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("writing delivery record %s: %w", want.Name, err)
	}
	return existing, nil
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
