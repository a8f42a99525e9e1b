package ipc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/ipc"
)

// The flows of example_test.go, run: the examples need a cluster, so they are only compiled.

// exampleHandler is ExampleRegister's handler.
var exampleHandler = ipc.HandlerFunc[*book](func(_ context.Context, b *book) (ipc.Result, error) {
	if b.Spec.ISBN == "" {
		return ipc.Result{}, ipc.InvalidSpec("this library catalogues books with an ISBN only")
	}
	return ipc.Done(fmt.Sprintf("catalogued %q", b.Spec.Title)), nil
})

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func ready(t *testing.T, b *book) *metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(b.Status.Conditions, conditions.TypeReady)
	if c == nil {
		t.Fatalf("%s has no Ready condition", b.Name)
	}
	return c
}

// The handler's outcome is the reply: Ready=True with its message, or a *TerminalError
// with its reason.
func TestCallRepliesWithTheHandlersOutcome(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	startReceiver(t, exampleHandler, ipc.Options{}, managerOptions{})

	b := newBook(ns, "dune")
	b.Spec.ISBN = "978-0-441-17271-9"
	if err := ipc.Call(callCtx(t), env.Client, b, ipc.Ready); err != nil {
		t.Fatalf("call: %v", err)
	}
	if r := ready(t, b); r.Status != metav1.ConditionTrue || r.Reason != conditions.ReasonSucceeded || r.Message != `catalogued "Dune"` {
		t.Fatalf("Ready = %+v, want True Succeeded with the handler's message", r)
	}

	refused := newBook(ns, "no-isbn")
	var terr *ipc.TerminalError
	if err := ipc.Call(callCtx(t), env.Client, refused, ipc.Ready); !errors.As(err, &terr) {
		t.Fatalf("call of a request the handler refuses: got %v, want *ipc.TerminalError", err)
	}
	if terr.Reason != conditions.ReasonInvalidSpec || terr.Message != "this library catalogues books with an ISBN only" {
		t.Fatalf("terminal error = %+v", terr)
	}
}

// Calling again with the same object under server-side apply is idempotent: same object,
// same generation, same reply. A changed spec is a new generation, and the call waits for
// the reply to that one.
func TestCallWithServerSideApplyIsIdempotent(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	startReceiver(t, exampleHandler, ipc.Options{}, managerOptions{})

	send := func() *book {
		b := newBook(ns, "emma")
		b.Spec.Title, b.Spec.Author, b.Spec.ISBN = "Emma", "Jane Austen", "978-0-14-143958-7"
		return b
	}
	first := send()
	if err := ipc.Call(callCtx(t), env.Client, first, ipc.Ready, ipc.WithServerSideApply("example")); err != nil {
		t.Fatalf("first call: %v", err)
	}
	again := send()
	if err := ipc.Call(callCtx(t), env.Client, again, ipc.Ready, ipc.WithServerSideApply("example")); err != nil {
		t.Fatalf("second call: %v", err)
	}
	if again.UID != first.UID || again.Generation != 1 || ready(t, again).Message != `catalogued "Emma"` {
		t.Fatalf("second call: uid %s (first %s), generation %d, Ready %+v; want the same object at generation 1 with the same reply",
			again.UID, first.UID, again.Generation, ready(t, again))
	}

	changed := send()
	changed.Spec.Title = "Emma (annotated)"
	if err := ipc.Call(callCtx(t), env.Client, changed, ipc.Ready, ipc.WithServerSideApply("example")); err != nil {
		t.Fatalf("call with a changed spec: %v", err)
	}
	if changed.Generation != 2 || changed.Status.ObservedGeneration != 2 || ready(t, changed).Message != `catalogued "Emma (annotated)"` {
		t.Fatalf("call with a changed spec: generation %d, observed %d, Ready %+v; want the reply to generation 2",
			changed.Generation, changed.Status.ObservedGeneration, ready(t, changed))
	}
}

// Await waits for a request someone else sent, knowing only its name.
func TestAwaitByName(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	startReceiver(t, exampleHandler, ipc.Options{}, managerOptions{})
	sent := newBook(ns, "ulysses")
	sent.Spec.Title, sent.Spec.Author, sent.Spec.ISBN = "Ulysses", "James Joyce", "978-0-679-72276-2"
	if err := env.Client.Create(context.Background(), sent); err != nil {
		t.Fatal(err)
	}

	b := &book{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ulysses"}}
	if err := ipc.Await(callCtx(t), env.Client, b, ipc.Ready); err != nil {
		t.Fatalf("await: %v", err)
	}
	if b.Generation != 1 || b.Status.ObservedGeneration != b.Generation || ready(t, b).Message != `catalogued "Ulysses"` {
		t.Fatalf("await returned generation %d, observed %d, Ready %+v", b.Generation, b.Status.ObservedGeneration, ready(t, b))
	}
}

// lossyClient stores creates but, for the first lose of them, loses the
// response on the way back, as when the API server restarts or the
// connection breaks just after the write.
type lossyClient struct {
	client.WithWatch
	lose     atomic.Int32
	attempts atomic.Int32
}

func (c *lossyClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	c.attempts.Add(1)
	sent := obj.DeepCopyObject().(client.Object)
	if err := c.WithWatch.Create(ctx, sent, opts...); err != nil {
		return err
	}
	if c.lose.Add(-1) >= 0 {
		return &url.Error{Op: "Post", URL: "https://apiserver", Err: io.ErrUnexpectedEOF}
	}
	return c.WithWatch.Scheme().Convert(sent, obj, nil)
}

// A create whose response was lost is retried, and the retry finds the request the lost
// attempt stored: the call waits for that one, and no second request is sent — for a
// name of the sender's and for one left to generateName alike.
func TestCallSurvivesLostCreateResponse(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	startReceiver(t, catalogue, ipc.Options{LeaseDuration: -1}, managerOptions{})

	for _, b := range []*book{newBook(ns, "lost"), {ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "lost-"}, Spec: newBook(ns, "").Spec}} {
		c := &lossyClient{WithWatch: env.Client}
		c.lose.Store(1)
		if err := ipc.Call(callCtx(t), c, b, ipc.Ready); err != nil {
			t.Fatalf("call with a lost create response: %v", err)
		}
		if n := c.attempts.Load(); n != 2 {
			t.Fatalf("%d create attempts, want 2 (the lost one and its retry)", n)
		}
		if b.UID == "" || b.Annotations[ipc.CallIDAnnotation] == "" || ready(t, b).Message != "catalogued Dune" {
			t.Fatalf("call returned uid %q, annotations %v, Ready %+v; want the stored request, answered", b.UID, b.Annotations, ready(t, b))
		}
	}
	var stored libraryv1alpha1.BookList
	if err := env.Client.List(context.Background(), &stored, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(stored.Items) != 2 {
		t.Fatalf("%d requests stored for 2 calls", len(stored.Items))
	}

	// A name taken by someone else's request is still an error: Call does not
	// adopt a request it did not send.
	other := newBook(ns, "lost")
	if err := ipc.Call(callCtx(t), env.Client, other, ipc.Ready); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("call with a name another call took: got %v, want AlreadyExists", err)
	}
}
