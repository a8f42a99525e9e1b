package ipc

import (
	"context"
	"errors"
	"fmt"
	"reflect"

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
// resourceVersion. When the watch ends it watches again from the last
// version it saw; when the API server no longer has that version (410 Gone:
// compacted away, or older than a restarted server's watch cache) it reads
// the object with a list, whose resourceVersion is the server's current one,
// and watches from there: no update is missed and none is needed twice.
// While the API server is unreachable it retries with backoff (at most every
// few seconds), until ctx ends.
//
// It returns a *TerminalError when the receiver reports a terminal failure,
// an error wrapping ErrDeleted when the object goes away, or an error
// wrapping ctx.Err().
func Await(ctx context.Context, c client.WithWatch, obj client.Object, cond Condition) error {
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	if err != nil {
		return fmt.Errorf("await: %w", err)
	}
	if obj.GetName() == "" {
		return fmt.Errorf("await %s: the object has no name", gvk.Kind)
	}
	list, err := newList(c.Scheme(), obj, gvk.GroupVersion().WithKind(gvk.Kind+"List"))
	if err != nil {
		return fmt.Errorf("await: %w", err)
	}
	w := &waiter{c: c, obj: obj, list: list, kind: gvk.Kind, cond: cond, rv: obj.GetResourceVersion(), backoff: newBackoff()}
	return w.run(ctx)
}

// waiter is one Await: the object as last seen, and the resourceVersion to
// watch from (the object's own, a bookmark's or a list's: not always the
// object's, so it is kept apart from obj).
type waiter struct {
	c       client.WithWatch
	obj     client.Object
	list    client.ObjectList
	kind    string
	cond    Condition
	rv      string
	backoff *wait.Backoff
}

func (w *waiter) run(ctx context.Context) error {
	if w.rv == "" {
		if err := w.relist(ctx); err != nil {
			return err
		}
	}
	for {
		if done, err := check(w.kind, w.obj, w.cond); done || err != nil {
			return err
		}
		var watcher watch.Interface
		err := limited(ctx, func() (err error) {
			watcher, err = w.c.Watch(ctx, w.list,
				client.InNamespace(w.obj.GetNamespace()),
				client.MatchingFields{"metadata.name": w.obj.GetName()},
				&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: w.rv, AllowWatchBookmarks: true}},
			)
			return err
		})
		progress, expired := false, false
		switch {
		case err == nil:
			var done bool
			done, progress, expired, err = w.consume(ctx, watcher)
			watcher.Stop()
			if done || err != nil {
				return err
			}
		case ctx.Err() != nil:
			return fmt.Errorf("await %s: %w (last attempt: %w)", w.name(), ctx.Err(), err)
		case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
			expired = true
		case !transient(err):
			return fmt.Errorf("await %s: watch: %w", w.name(), err)
		}
		// A watch that brought news is followed by the next at once; one that
		// failed or ended without any (the server is away, restarting, or
		// refuses the version) by a growing pause, so that a waiter never
		// spins against a server that cannot serve it yet.
		if progress {
			w.backoff = newBackoff()
		} else if err := sleepCtx(ctx, w.backoff.Step()); err != nil {
			return fmt.Errorf("await %s: %w", w.name(), err)
		}
		if expired {
			if err := w.relist(ctx); err != nil {
				return err
			}
		}
	}
}

// consume applies one watch's events to obj until the wait is decided or the
// watch ends. progress says whether any event came; expired, whether the
// watch ended because the server no longer has w.rv.
func (w *waiter) consume(ctx context.Context, watcher watch.Interface) (done, progress, expired bool, err error) {
	for {
		select {
		case <-ctx.Done():
			return false, progress, false, fmt.Errorf("await %s: %w", w.name(), ctx.Err())
		case ev, open := <-watcher.ResultChan():
			if !open {
				return false, progress, false, nil
			}
			switch ev.Type {
			case watch.Error:
				// Typically 410 Gone: w.rv was compacted away. Whatever the
				// error, a fresh read is the way on.
				return false, progress, true, nil
			case watch.Bookmark:
				if m, err := metaAccessor(ev.Object); err == nil {
					w.rv, progress = m.GetResourceVersion(), true
				}
			case watch.Deleted:
				return false, progress, false, fmt.Errorf("await %s: %w", w.name(), ErrDeleted)
			case watch.Added, watch.Modified:
				if err := assign(w.obj, ev.Object); err != nil {
					return false, progress, false, err
				}
				w.rv, progress = w.obj.GetResourceVersion(), true
				if done, err := check(w.kind, w.obj, w.cond); done || err != nil {
					return done, progress, false, err
				}
			}
		}
	}
}

// relist reads the object with a list of that one name: besides the object it
// returns the API server's current resourceVersion, from which a watch is
// served even when the object's own version predates the server's watch
// cache (after a restart, for an object unchanged since).
func (w *waiter) relist(ctx context.Context) error {
	err := retry(ctx, w.backoff, func() error {
		return limited(ctx, func() error {
			return w.c.List(ctx, w.list, client.InNamespace(w.obj.GetNamespace()), client.MatchingFields{"metadata.name": w.obj.GetName()})
		})
	})
	if err != nil {
		return fmt.Errorf("await %s: %w", w.name(), err)
	}
	items, err := meta.ExtractList(w.list)
	if err != nil {
		return fmt.Errorf("await %s: %w", w.name(), err)
	}
	if len(items) == 0 {
		return fmt.Errorf("await %s: %w", w.name(), ErrDeleted)
	}
	// A copy: the next list decodes into the same items.
	if err := assign(w.obj, items[0].DeepCopyObject()); err != nil {
		return err
	}
	w.rv = w.list.GetResourceVersion()
	return nil
}

func (w *waiter) name() string {
	return w.kind + " " + key(w.obj.GetNamespace(), w.obj.GetName())
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
