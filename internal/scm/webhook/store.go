package webhook

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
	"github.com/crdipc/crdipc/ipc"
)

// ReportingController is the reportingController of every Event the listener writes.
const ReportingController = "crdipc.io/webhook-listener"

// DeliveryAnnotation names the X-GitHub-Delivery that last changed an object's spec.
const DeliveryAnnotation = "scm.crdipc.io/delivery"

// Results of a delivery, the result label of crdipc_webhook_deliveries_total.
const (
	resultCreated   = "created"   // the object was created
	resultUpdated   = "updated"   // the object was changed
	resultUnchanged = "unchanged" // the object already said this
	resultStale     = "stale"     // the object holds newer state; only the Event was written
	resultDuplicate = "duplicate" // this delivery was processed before; nothing was written
	resultPong      = "pong"
	resultIgnored   = "ignored"
)

// conflictBackoff spreads retries of deliveries racing for one object (GitHub sends a burst
// of actions for one pull request at once) over up to ~2.5 s, inside the delivery's timeout.
var conflictBackoff = wait.Backoff{Steps: 10, Duration: 5 * time.Millisecond, Factor: 2, Jitter: 0.5, Cap: time.Second}

// errCollision: the deterministic name is held by an object of another repository.
var errCollision = errors.New("name taken by another repository")

// errNamesTaken: both the name and its collision fallback are held by other repositories.
var errNamesTaken = errors.New("object names held by other repositories")

// stored is the result of writing the object of one delivery.
type stored struct {
	obj    client.Object
	result string
	// event is the Event found to record the body already, when result is duplicate.
	event string
}

// store writes c's object, then its Event, so that a 2xx answer means both are stored and a
// failure in between leaves a state that the redelivery completes: the object write is
// idempotent and the Event is created only if missing. The Event is named after the body
// (record, its Delivery record's name), so that concurrent copies of one body, under one
// delivery ID or two, create one Event between them. legacy is the delivery ID of a record an
// earlier listener left pending, "" otherwise: that listener may have stored the Event under
// its own name for it (legacyEventName).
func (l *Listener) store(ctx context.Context, c *change, record, delivery, legacy string) (*stored, string, error) {
	name := c.name
	s, err := l.writeObject(ctx, name, c, record, delivery, legacy)
	if errors.Is(err, errCollision) {
		name = collisionName(c.name, c.identity)
		s, err = l.writeObject(ctx, name, c, record, delivery, legacy)
		if errors.Is(err, errCollision) {
			return nil, "", fmt.Errorf("%w: %s and %s", errNamesTaken, c.name, name)
		}
	}
	if err != nil {
		return nil, "", err
	}
	evName := EventName(s.obj.GetName(), record)
	if s.result == resultDuplicate {
		return s, s.event, nil
	}
	if legacy != "" {
		old := legacyEventName(s.obj.GetName(), legacy)
		if done, err := l.eventExists(ctx, old); err != nil {
			return nil, "", fmt.Errorf("%s/%s is stored but its event is not known: %w", c.resource(), s.obj.GetName(), err)
		} else if done {
			s.result = resultDuplicate
			return s, old, nil
		}
	}
	ev := l.newEvent(evName, s, c, delivery)
	ipc.InjectTraceContext(ctx, ev)
	if err := l.client.Create(ctx, ev); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return nil, "", fmt.Errorf("%s/%s is stored but its event is not: %w", c.resource(), s.obj.GetName(), err)
		}
		// Processed before, or by a concurrent copy: what this attempt wrote was the same
		// idempotent write.
		s.result = resultDuplicate
	}
	return s, evName, nil
}

// writeObject creates or updates the named object with optimistic concurrency, retrying on
// conflicts with concurrent deliveries for the same object.
//
// The first attempt reads the object from the listener's cache, which saves the API server a
// consistent read per delivery: a cache that lags is caught by the write itself (conflict on
// a stale resourceVersion, AlreadyExists on a missing object) and the retry reads live. A
// decision not to write (stale, unchanged, duplicate) is only taken on a live read, because a
// lagging cache could make it wrongly.
func (l *Listener) writeObject(ctx context.Context, name string, c *change, record, delivery, legacy string) (*stored, error) {
	var out *stored
	useCache := l.synced.Load()
	key := client.ObjectKey{Namespace: l.opts.Namespace, Name: name}
	err := retry.OnError(conflictBackoff, func(err error) bool {
		return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)
	}, func() error {
		fromCache := useCache
		useCache = false
		for {
			cur := newObject(c.kind)
			var err error
			if fromCache {
				err = l.cache.Get(ctx, key, cur)
			} else {
				err = l.client.Get(ctx, key, cur)
			}
			if apierrors.IsNotFound(err) {
				obj := newObject(c.kind)
				obj.SetNamespace(l.opts.Namespace)
				obj.SetName(name)
				setSpec(obj, c, delivery)
				ipc.InjectTraceContext(ctx, obj)
				if err := l.client.Create(ctx, obj); err != nil {
					return err
				}
				out = &stored{obj: obj, result: resultCreated}
				return nil
			}
			if err != nil {
				return err
			}
			if !sameIdentity(cur, c) {
				return errCollision // identities are immutable: a cached one is as good as a live one
			}
			next, result, event, err := l.decide(ctx, cur, c, name, record, delivery, legacy)
			if err != nil {
				return err
			}
			if next == nil {
				if fromCache {
					fromCache = false // confirm on a live read
					continue
				}
				out = &stored{obj: cur, result: result, event: event}
				return nil
			}
			ipc.InjectTraceContext(ctx, next)
			if err := l.client.Update(ctx, next); err != nil {
				return err
			}
			out = &stored{obj: next, result: resultUpdated}
			return nil
		}
	})
	return out, err
}

// decide returns the object to write for c, or nil and the result when nothing is to be
// written (and, for a duplicate, the Event that records the body).
func (l *Listener) decide(ctx context.Context, cur client.Object, c *change, name, record, delivery, legacy string) (client.Object, string, string, error) {
	at := storedAt(cur)
	if at != nil && c.at.Before(at.Time) {
		return nil, resultStale, "", nil
	}
	next := cur.DeepCopyObject().(client.Object)
	setSpec(next, c, delivery)
	if equality.Semantic.DeepEqual(specOf(cur), specOf(next)) {
		return nil, resultUnchanged, "", nil
	}
	if c.untimed || (at != nil && c.at.Equal(at.Time)) {
		// A tie in time orders by arrival, but a redelivery must not undo what the delivery
		// after it wrote: its Event says it was processed already.
		names := []string{EventName(name, record)}
		if legacy != "" {
			names = append(names, legacyEventName(name, legacy))
		}
		for _, ev := range names {
			done, err := l.eventExists(ctx, ev)
			if err != nil {
				return nil, "", "", err
			}
			if done {
				return nil, resultDuplicate, ev, nil
			}
		}
	}
	return next, resultUpdated, "", nil
}

func (l *Listener) eventExists(ctx context.Context, name string) (bool, error) {
	err := l.client.Get(ctx, client.ObjectKey{Namespace: l.opts.Namespace, Name: name}, &corev1.Event{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// resource is the plural resource name of the change's kind, as kubectl shows it.
func (c *change) resource() string {
	if c.kind == "PullRequest" {
		return "pullrequests"
	}
	return "branches"
}

func newObject(kind string) client.Object {
	if kind == "PullRequest" {
		return &scmv1alpha1.PullRequest{}
	}
	return &scmv1alpha1.Branch{}
}

func specOf(obj client.Object) any {
	switch o := obj.(type) {
	case *scmv1alpha1.PullRequest:
		return o.Spec
	case *scmv1alpha1.Branch:
		return o.Spec
	}
	return nil
}

func storedAt(obj client.Object) *metav1.Time {
	switch o := obj.(type) {
	case *scmv1alpha1.PullRequest:
		return o.Spec.UpdatedAt
	case *scmv1alpha1.Branch:
		return o.Spec.UpdatedAt
	}
	return nil
}

// sameIdentity reports whether obj is the pull request or branch c describes. GitHub
// repository names are case-insensitive; git branch names are not.
func sameIdentity(obj client.Object, c *change) bool {
	switch o := obj.(type) {
	case *scmv1alpha1.PullRequest:
		return c.pr != nil && strings.EqualFold(o.Spec.Repository, c.pr.Repository) && o.Spec.Number == c.pr.Number
	case *scmv1alpha1.Branch:
		return c.branch != nil && strings.EqualFold(o.Spec.Repository, c.branch.Repository) && o.Spec.Name == c.branch.Name
	}
	return false
}

// setSpec writes c into obj. Fields that are immutable in the CRD keep the stored value
// (GitHub may change a repository name's case), and a delivery without a head SHA (create)
// keeps the one a push stored.
func setSpec(obj client.Object, c *change, delivery string) {
	switch o := obj.(type) {
	case *scmv1alpha1.PullRequest:
		spec := *c.pr
		if o.Spec.Repository != "" {
			spec.Repository, spec.Number = o.Spec.Repository, o.Spec.Number
		}
		if o.Spec.ID != 0 {
			spec.ID = o.Spec.ID
		}
		o.Spec = spec
	case *scmv1alpha1.Branch:
		spec := *c.branch
		if o.Spec.Repository != "" {
			spec.Repository, spec.Name = o.Spec.Repository, o.Spec.Name
		}
		if spec.HeadSHA == "" {
			spec.HeadSHA = o.Spec.HeadSHA
		}
		o.Spec = spec
	}
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[DeliveryAnnotation] = delivery
	obj.SetAnnotations(ann)
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels["app.kubernetes.io/managed-by"] = "crdipc-webhook-listener"
	obj.SetLabels(labels)
}

// newEvent is the core/v1 Event recording one delivery on obj. It is written directly, not
// through a record.EventRecorder: the recorder aggregates and rate-limits, and its names are
// random, which would defeat one-Event-per-delivery.
func (l *Listener) newEvent(name string, s *stored, c *change, delivery string) *corev1.Event {
	now := time.Now()
	obj, msg := s.obj, c.message
	if at := storedAt(obj); s.result == resultStale && at != nil {
		msg += fmt.Sprintf("; delivered after newer state (%s < %s), object not changed",
			c.at.UTC().Format(time.RFC3339), at.UTC().Format(time.RFC3339))
	}
	return &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   obj.GetNamespace(),
			Annotations: map[string]string{DeliveryAnnotation: delivery},
		},
		InvolvedObject: corev1.ObjectReference{
			APIVersion:      scmv1alpha1.GroupVersion.String(),
			Kind:            c.kind,
			Namespace:       obj.GetNamespace(),
			Name:            obj.GetName(),
			UID:             obj.GetUID(),
			ResourceVersion: obj.GetResourceVersion(),
		},
		Reason:              c.reason,
		Message:             truncate(msg, 1000),
		Type:                corev1.EventTypeNormal,
		Action:              c.action,
		Source:              corev1.EventSource{Component: ReportingController},
		ReportingController: ReportingController,
		ReportingInstance:   l.opts.Instance,
		FirstTimestamp:      metav1.NewTime(now),
		LastTimestamp:       metav1.NewTime(now),
		EventTime:           metav1.NewMicroTime(now),
		Count:               1,
	}
}
