package ipc

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/testenv"
)

// staleCache is a client whose reads of one object return an old copy, as an informer
// cache does until the watch delivers the receiver's own last write; writes go through.
type staleCache struct {
	client.Client
	old *libraryv1alpha1.Book
}

func (c staleCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if b, ok := obj.(*libraryv1alpha1.Book); ok && key == client.ObjectKeyFromObject(c.old) {
		c.old.DeepCopyInto(b)
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

type countingHandler struct{ calls int }

func (h *countingHandler) Handle(context.Context, *libraryv1alpha1.Book) (Result, error) {
	h.calls++
	return Done("filed"), nil
}

// A status write that conflicts because the cache is behind is retried at once from the
// API server, not after a requeue.
func TestReconcileRetriesStaleCacheFromAPIServer(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	book := &libraryv1alpha1.Book{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "stale"},
		Spec:       libraryv1alpha1.BookSpec{Title: "T", Author: "A"},
	}
	if err := env.Client.Create(ctx, book); err != nil {
		t.Fatal(err)
	}
	old := book.DeepCopy()
	// A write the cache has not seen: the copy it holds is one resourceVersion behind.
	meta.SetStatusCondition(&book.Status.Conditions, metav1.Condition{Type: conditions.TypeReady, Status: metav1.ConditionFalse, Reason: conditions.ReasonReconciling, Message: "earlier"})
	if err := env.Client.Status().Update(ctx, book); err != nil {
		t.Fatal(err)
	}

	h := &countingHandler{}
	r := &receiver[*libraryv1alpha1.Book]{
		tracer:  noop.NewTracerProvider().Tracer(""),
		kind:    "Book",
		typ:     reflect.TypeFor[libraryv1alpha1.Book](),
		c:       staleCache{Client: env.Client, old: old},
		live:    env.Client,
		handler: h,
		opts:    Options{Name: "stale-test"},
		events:  &eventWriter{c: env.Client, scheme: scheme.Scheme, controller: "crdipc.io/stale-test", instance: "test"},
	}
	res, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(book)})
	if err != nil || res.RequeueAfter != 0 {
		t.Fatalf("Reconcile = %+v, %v; want done in this call", res, err)
	}
	if h.calls != 2 {
		t.Errorf("handler called %d times, want 2 (stale copy, then the API server's)", h.calls)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(book), book); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(book.Status.Conditions, conditions.TypeReady); c == nil || c.Status != metav1.ConditionTrue || c.Message != "filed" {
		t.Errorf("Ready = %+v, want True \"filed\"", c)
	}
}

// lostStatusResponse is a client whose next status update fails as when the connection
// breaks: stored (or, with drop, not stored), but the answer never comes.
type lostStatusResponse struct {
	client.Client
	fail, drop bool
}

func (c *lostStatusResponse) Status() client.SubResourceWriter {
	return &lostStatusWriter{SubResourceWriter: c.Client.Status(), c: c}
}

type lostStatusWriter struct {
	client.SubResourceWriter
	c *lostStatusResponse
}

func (w *lostStatusWriter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if !w.c.fail {
		return w.SubResourceWriter.Update(ctx, obj, opts...)
	}
	w.c.fail = false
	if !w.c.drop {
		if err := w.SubResourceWriter.Update(ctx, obj.DeepCopyObject().(client.Object), opts...); err != nil {
			return err
		}
	}
	return errors.New("http2: client connection lost")
}

// The Event of a transition is written after the status that shows it, and exactly once:
// not when the status write did not store it, and still when the status was stored but
// its response was lost, so that the retry finds no transition left to report.
func TestEventFollowsStoredStatus(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	for _, drop := range []bool{false, true} {
		name := map[bool]string{false: "response-lost", true: "write-lost"}[drop]
		book := &libraryv1alpha1.Book{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       libraryv1alpha1.BookSpec{Title: "T", Author: "A"},
		}
		if err := env.Client.Create(ctx, book); err != nil {
			t.Fatal(err)
		}
		c := &lostStatusResponse{Client: env.Client, fail: true, drop: drop}
		r := &receiver[*libraryv1alpha1.Book]{
			tracer:  noop.NewTracerProvider().Tracer(""),
			kind:    "Book",
			typ:     reflect.TypeFor[libraryv1alpha1.Book](),
			c:       c,
			live:    env.Client,
			handler: &countingHandler{},
			opts:    Options{Name: "event-order-test"},
			events:  &eventWriter{c: env.Client, scheme: scheme.Scheme, controller: "crdipc.io/event-order-test", instance: "test"},
		}
		req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(book)}
		events := func() int {
			var list corev1.EventList
			if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, e := range list.Items {
				if e.InvolvedObject.Name == name && e.Reason == conditions.ReasonSucceeded {
					n++
				}
			}
			return n
		}
		if res, err := r.Reconcile(ctx, req); err != nil || res.RequeueAfter == 0 {
			t.Fatalf("%s: first Reconcile = %+v, %v; want a retry", name, res, err)
		}
		if n := events(); n != 0 {
			t.Errorf("%s: %d Events before the status is known to be stored, want 0", name, n)
		}
		for range 2 {
			if _, err := r.Reconcile(ctx, req); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		if n := events(); n != 1 {
			t.Errorf("%s: %d Succeeded Events, want 1", name, n)
		}
		if _, owed := r.owed.Load(req.NamespacedName); owed {
			t.Errorf("%s: an Event is still owed", name)
		}
	}
}

// holdingHandler returns each Result of its script in turn, then Done.
type holdingHandler struct {
	script []Result
	calls  int
}

func (h *holdingHandler) Handle(context.Context, *libraryv1alpha1.Book) (Result, error) {
	h.calls++
	if h.calls <= len(h.script) {
		return h.script[h.calls-1], nil
	}
	return Done("filed"), nil
}

// A held progress report writes nothing and comes back after the hold; a request that
// then completes goes from no status straight to Ready, with one Event. A hold is not
// honoured once the stored status has a verdict on the current generation: it would
// leave that verdict standing.
func TestHoldStatus(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	newReceiver := func(h Handler[*libraryv1alpha1.Book]) *receiver[*libraryv1alpha1.Book] {
		return &receiver[*libraryv1alpha1.Book]{
			tracer: noop.NewTracerProvider().Tracer(""),
			kind:   "Book", typ: reflect.TypeFor[libraryv1alpha1.Book](),
			c: env.Client, live: env.Client, handler: h, opts: Options{Name: "hold-test"},
			events: &eventWriter{c: env.Client, scheme: scheme.Scheme, controller: "crdipc.io/hold-test", instance: "test"},
		}
	}
	book := &libraryv1alpha1.Book{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "held"}, Spec: libraryv1alpha1.BookSpec{Title: "T", Author: "A"}}
	if err := env.Client.Create(ctx, book); err != nil {
		t.Fatal(err)
	}
	rv := book.ResourceVersion
	progress := Result{Reason: conditions.ReasonWaiting, Message: "shelving", HoldStatus: time.Second}
	r := newReceiver(&holdingHandler{script: []Result{progress}})
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(book)}
	res, err := r.Reconcile(ctx, req)
	if err != nil || res.RequeueAfter != time.Second {
		t.Fatalf("held Reconcile = %+v, %v; want a call again after the hold (1s)", res, err)
	}
	if err := env.Client.Get(ctx, req.NamespacedName, book); err != nil {
		t.Fatal(err)
	}
	if book.ResourceVersion != rv {
		t.Errorf("held progress was written: resourceVersion %s → %s, status %+v", rv, book.ResourceVersion, book.Status)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, req.NamespacedName, book); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(book.Status.Conditions, conditions.TypeReady); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("after the hold: Ready = %+v, want True", c)
	}
	var list corev1.EventList
	if err := env.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		if e.InvolvedObject.Name == book.Name && e.Reason != conditions.ReasonSucceeded {
			t.Errorf("Event %s %q for a held report", e.Reason, e.Message)
		}
	}

	// Ready for generation 1: a held report now would leave Ready=True standing.
	r = newReceiver(&holdingHandler{script: []Result{progress}})
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, req.NamespacedName, book); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(book.Status.Conditions, conditions.TypeReady); c == nil || c.Reason != conditions.ReasonWaiting {
		t.Errorf("hold over a current verdict: Ready = %+v, want the Waiting report written", c)
	}
}

// gatedPatch is a client whose patches wait until the handler has started (started is
// closed), or fail with err without reaching the API server.
type gatedPatch struct {
	client.Client
	started <-chan struct{}
	err     error
}

func (c gatedPatch) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	select {
	case <-c.started:
	case <-time.After(5 * time.Second):
		return errors.New("the handler did not start while the finalizer was being written")
	}
	if c.err != nil {
		return c.err
	}
	return c.Client.Patch(ctx, obj, patch, opts...)
}

// finalizingHandler signals when Handle starts, and reports whether the request's
// finalizer was stored by then.
type finalizingHandler struct {
	started     chan struct{}
	finalizer   string
	live        client.Reader
	storedFirst []bool
}

func (h *finalizingHandler) Handle(ctx context.Context, b *libraryv1alpha1.Book) (Result, error) {
	var stored libraryv1alpha1.Book
	if err := h.live.Get(ctx, client.ObjectKeyFromObject(b), &stored); err != nil {
		return Result{}, err
	}
	h.storedFirst = append(h.storedFirst, slices.Contains(stored.Finalizers, h.finalizer))
	close(h.started)
	return Done("filed"), nil
}

func (h *finalizingHandler) Finalize(context.Context, *libraryv1alpha1.Book) error { return nil }

// With OwnedEffects the finalizer is written while the handler runs, and the status only
// once the finalizer is stored: a failed finalizer write fails the reconcile and writes
// no status.
func TestOwnedEffectsAddFinalizerAlongside(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	const fin = "crdipc.io/owned-test"
	for _, fail := range []bool{false, true} {
		name := map[bool]string{false: "finalizer-stored", true: "finalizer-failed"}[fail]
		book := &libraryv1alpha1.Book{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: libraryv1alpha1.BookSpec{Title: "T", Author: "A"}}
		if err := env.Client.Create(ctx, book); err != nil {
			t.Fatal(err)
		}
		rv := book.ResourceVersion
		h := &finalizingHandler{started: make(chan struct{}), finalizer: fin, live: env.Client}
		c := gatedPatch{Client: env.Client, started: h.started}
		if fail {
			c.err = errors.New("http2: client connection lost")
		}
		r := &receiver[*libraryv1alpha1.Book]{
			tracer: noop.NewTracerProvider().Tracer(""),
			kind:   "Book", typ: reflect.TypeFor[libraryv1alpha1.Book](),
			c: c, live: env.Client, handler: h, finalizer: h,
			opts:   Options{Name: "owned-test", Finalizer: fin, OwnedEffects: true},
			events: &eventWriter{c: env.Client, scheme: scheme.Scheme, controller: "crdipc.io/owned-test", instance: "test"},
		}
		req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(book)}
		_, err := r.reconcile(ctx, req, env.Client, queued{})
		if err := env.Client.Get(ctx, req.NamespacedName, book); err != nil {
			t.Fatal(err)
		}
		if len(h.storedFirst) != 1 || h.storedFirst[0] {
			t.Errorf("%s: handler calls saw the finalizer stored: %v; want one call, before it was", name, h.storedFirst)
		}
		if fail {
			if err == nil {
				t.Errorf("%s: reconcile succeeded although the finalizer write failed", name)
			}
			if book.ResourceVersion != rv {
				t.Errorf("%s: written although the finalizer was not: resourceVersion %s → %s, status %+v", name, rv, book.ResourceVersion, book.Status)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: reconcile: %v", name, err)
		}
		if !slices.Contains(book.Finalizers, fin) {
			t.Errorf("%s: finalizers %v, want %s", name, book.Finalizers, fin)
		}
		if c := meta.FindStatusCondition(book.Status.Conditions, conditions.TypeReady); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("%s: Ready = %+v, want True", name, c)
		}
	}
}

// A sender applying the same spec again writes a new trace context and nothing else: the
// stored status answers it, so the receiver is not woken. Any other annotation change
// does wake it.
func TestRequestChangedIgnoresTraceContext(t *testing.T) {
	const tp1, tp2 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "00-1af7651916cd43dd8448eb211c80319c-c7ad6b7169203331-01"
	for _, tc := range []struct {
		name     string
		old, new map[string]string
		want     bool
	}{
		{"new traceparent", map[string]string{TraceParentAnnotation: tp1}, map[string]string{TraceParentAnnotation: tp2}, false},
		{"first traceparent", nil, map[string]string{TraceParentAnnotation: tp1, TraceStateAnnotation: "k=v"}, false},
		{"traceparent gone", map[string]string{TraceParentAnnotation: tp1, "a": "1"}, map[string]string{"a": "1"}, false},
		{"another annotation changed", map[string]string{TraceParentAnnotation: tp1, "a": "1"}, map[string]string{TraceParentAnnotation: tp2, "a": "2"}, true},
		{"another annotation added", map[string]string{TraceParentAnnotation: tp1}, map[string]string{TraceParentAnnotation: tp1, "a": ""}, true},
		{"another annotation removed", map[string]string{"a": ""}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &libraryv1alpha1.Book{ObjectMeta: metav1.ObjectMeta{Generation: 1, Annotations: tc.old}}
			n := &libraryv1alpha1.Book{ObjectMeta: metav1.ObjectMeta{Generation: 1, Annotations: tc.new}}
			if got := requestChanged.Update(event.UpdateEvent{ObjectOld: o, ObjectNew: n}); got != tc.want {
				t.Errorf("requestChanged = %v, want %v", got, tc.want)
			}
		})
	}
}
