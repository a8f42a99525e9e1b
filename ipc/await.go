package ipc

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/crdipc/crdipc/api/conditions"
)

// Condition decides whether a wait is over. Await calls it only with a
// status that is current (observedGeneration >= generation).
type Condition func(obj client.Object, s Status) (bool, error)

// ConditionTrue is satisfied when the condition of type t is True for the
// current generation.
func ConditionTrue(t string) Condition {
	return func(_ client.Object, s Status) (bool, error) {
		c := s.Condition(t)
		return c != nil && c.Status == metav1.ConditionTrue, nil
	}
}

// Ready is the condition most senders wait for: the request is done.
var Ready = ConditionTrue(conditions.TypeReady)

// TerminalError is returned by Await when the receiver gave up on the
// object's current generation (Ready=False with a terminal reason).
type TerminalError struct {
	Kind, Namespace, Name string
	Generation            int64
	Reason, Message       string
}

func (e *TerminalError) Error() string {
	return fmt.Sprintf("%s %s: %s: %s", e.Kind, key(e.Namespace, e.Name), e.Reason, e.Message)
}

// ErrDeleted is returned (wrapped) by Await when the object is deleted
// before the condition held.
var ErrDeleted = errors.New("object was deleted while waiting")

func key(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// Await blocks until obj's status is current and cond holds, and leaves the
// latest observed state in obj. obj must hold the name (and namespace) and,
// ideally, the resourceVersion the caller last saw — typically the object
// Create returned. Await never polls: it watches that one object from that
// resourceVersion, and when the watch ends early or its resourceVersion is
// too old (410 Gone) it reads the object again and watches from there, so no
// update is missed and none is needed twice.
//
// It returns a *TerminalError when the receiver reports a terminal failure,
// an error wrapping ErrDeleted when the object goes away, or ctx.Err().
func Await(ctx context.Context, c client.WithWatch, obj client.Object, cond Condition) error {
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	if err != nil {
		return fmt.Errorf("await: %w", err)
	}
	list, err := newList(c.Scheme(), obj, gvk.GroupVersion().WithKind(gvk.Kind+"List"))
	if err != nil {
		return fmt.Errorf("await: %w", err)
	}
	if obj.GetResourceVersion() == "" {
		if err := refresh(ctx, c, obj, gvk.Kind, newBackoff()); err != nil {
			return err
		}
	}
	backoff := newBackoff()
	for {
		if done, err := check(gvk.Kind, obj, cond); done || err != nil {
			return err
		}
		w, err := c.Watch(ctx, list,
			client.InNamespace(obj.GetNamespace()),
			client.MatchingFields{"metadata.name": obj.GetName()},
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: obj.GetResourceVersion(), AllowWatchBookmarks: true}},
		)
		if err == nil {
			done, err := consume(ctx, w, gvk.Kind, obj, cond)
			w.Stop()
			if done || err != nil {
				return err
			}
			backoff = newBackoff()
		} else if ctx.Err() != nil {
			return ctx.Err()
		} else if permanent(err) {
			return fmt.Errorf("await %s %s: watch: %w", gvk.Kind, key(obj.GetNamespace(), obj.GetName()), err)
		} else if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
			// The API server is unreachable or overloaded (e.g. restarting):
			// back off and try again; the request is durable meanwhile.
			if err := sleepCtx(ctx, backoff.Step()); err != nil {
				return err
			}
		}
		// The watch ended (server timeout or restart, 410 Gone): re-read the
		// object so the next watch starts from a version the server still has.
		if err := refresh(ctx, c, obj, gvk.Kind, backoff); err != nil {
			return err
		}
	}
}

// consume applies one watch's events to obj until the wait is decided or the
// watch ends; it reports done=false, err=nil when a new watch is needed.
func consume(ctx context.Context, w watch.Interface, kind string, obj client.Object, cond Condition) (bool, error) {
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case ev, open := <-w.ResultChan():
			if !open {
				return false, nil
			}
			switch ev.Type {
			case watch.Error:
				// Typically 410 Gone: our resourceVersion was compacted away.
				return false, nil
			case watch.Bookmark:
				if m, err := metaAccessor(ev.Object); err == nil {
					obj.SetResourceVersion(m.GetResourceVersion())
				}
			case watch.Deleted:
				return false, fmt.Errorf("await %s %s: %w", kind, key(obj.GetNamespace(), obj.GetName()), ErrDeleted)
			case watch.Added, watch.Modified:
				if err := assign(obj, ev.Object); err != nil {
					return false, err
				}
				if done, err := check(kind, obj, cond); done || err != nil {
					return done, err
				}
			}
		}
	}
}

func check(kind string, obj client.Object, cond Condition) (bool, error) {
	s, err := StatusOf(obj)
	if err != nil {
		return false, err
	}
	if !s.Current() {
		return false, nil
	}
	if r := s.Condition(conditions.TypeReady); r != nil && r.Status == metav1.ConditionFalse && conditions.IsTerminal(r.Reason) {
		return true, &TerminalError{Kind: kind, Namespace: obj.GetNamespace(), Name: obj.GetName(), Generation: s.Generation, Reason: r.Reason, Message: r.Message}
	}
	return cond(obj, s)
}

func refresh(ctx context.Context, c client.Client, obj client.Object, kind string, backoff *wait.Backoff) error {
	for {
		err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		switch {
		case err == nil:
			return nil
		case apierrors.IsNotFound(err):
			return fmt.Errorf("await %s %s: %w", kind, key(obj.GetNamespace(), obj.GetName()), ErrDeleted)
		case ctx.Err() != nil:
			return ctx.Err()
		case permanent(err):
			return fmt.Errorf("await %s %s: %w", kind, key(obj.GetNamespace(), obj.GetName()), err)
		}
		if err := sleepCtx(ctx, backoff.Step()); err != nil {
			return err
		}
	}
}

// permanent reports errors that retrying cannot fix.
func permanent(err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) || apierrors.IsBadRequest(err) ||
		apierrors.IsInvalid(err) || apierrors.IsMethodNotSupported(err) || apierrors.IsNotAcceptable(err) ||
		apierrors.IsUnsupportedMediaType(err) || meta.IsNoMatchError(err)
}

func newBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: 2 * time.Second}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// assign copies a watched object into the caller's object, whose concrete
// type the watch decoded into as well.
func assign(dst client.Object, src runtime.Object) error {
	if u, ok := dst.(*unstructured.Unstructured); ok {
		su, ok := src.(*unstructured.Unstructured)
		if !ok {
			return fmt.Errorf("await: watch returned %T for an unstructured object", src)
		}
		u.Object = su.Object
		return nil
	}
	dv, sv := reflect.ValueOf(dst), reflect.ValueOf(src)
	if dv.Type() != sv.Type() {
		return fmt.Errorf("await: watch returned %T, want %T", src, dst)
	}
	dv.Elem().Set(sv.Elem())
	return nil
}

func newList(s *runtime.Scheme, obj client.Object, listGVK schema.GroupVersionKind) (client.ObjectList, error) {
	if _, ok := obj.(*unstructured.Unstructured); ok {
		l := &unstructured.UnstructuredList{}
		l.SetGroupVersionKind(listGVK)
		return l, nil
	}
	o, err := s.New(listGVK)
	if err != nil {
		return nil, err
	}
	l, ok := o.(client.ObjectList)
	if !ok {
		return nil, fmt.Errorf("%s is not a list type", listGVK)
	}
	return l, nil
}

func metaAccessor(o runtime.Object) (metav1.Object, error) {
	m, ok := o.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no metadata", o)
	}
	return m, nil
}
