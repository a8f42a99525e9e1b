package ipc_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/ipc"
)

// The examples are programs to copy: they use only ipc, the API types and controller-runtime,
// and talk to the cluster in KUBECONFIG (`crdipc up` prints one to export). They need a
// running API server, so they are compiled but not run; call_test.go runs the same flows
// against the embedded control plane.

// exampleScheme knows the request kind and the built-in kinds a receiver writes (Events,
// Leases).
func exampleScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(libraryv1alpha1.AddToScheme(s))
	return s
}

// A receiver is a handler for one kind, registered on a controller-runtime manager. ipc
// does the rest: finalizer, observedGeneration, the Ready condition, an Event per outcome,
// metrics, retries with backoff, and the Lease that ReceiverReady reads. This is a
// receiver's whole main; it serves until interrupted.
func ExampleRegister() {
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{Scheme: exampleScheme()})
	if err != nil {
		log.Fatal(err)
	}
	err = ipc.Register(mgr, &libraryv1alpha1.Book{}, ipc.HandlerFunc[*libraryv1alpha1.Book](
		func(ctx context.Context, b *libraryv1alpha1.Book) (ipc.Result, error) {
			if b.Spec.ISBN == "" {
				// Terminal: no retry until the spec changes; the sender gets a *TerminalError.
				return ipc.Result{}, ipc.InvalidSpec("this library catalogues books with an ISBN only")
			}
			return ipc.Done(fmt.Sprintf("catalogued %q", b.Spec.Title)), nil
		}), ipc.Options{})
	if err != nil {
		log.Fatal(err)
	}
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Fatal(err)
	}
}

// Call sends a request and waits for the reply in its status. With server-side apply,
// calling again with the same object is idempotent: same object, same reply.
func ExampleCall() {
	c, err := client.NewWithWatch(ctrl.GetConfigOrDie(), client.Options{Scheme: exampleScheme()})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	book := &libraryv1alpha1.Book{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "emma"},
		Spec:       libraryv1alpha1.BookSpec{Title: "Emma", Author: "Jane Austen", ISBN: "978-0-14-143958-7"},
	}
	err = ipc.Call(ctx, c, book, ipc.Ready, ipc.WithServerSideApply("example-sender"))
	var refused *ipc.TerminalError
	switch {
	case errors.As(err, &refused):
		fmt.Println("refused:", refused.Reason, refused.Message)
	case err != nil:
		log.Fatal(err) // no reply before ctx ended, or the request could not be written
	default:
		ready := meta.FindStatusCondition(book.Status.Conditions, conditions.TypeReady)
		fmt.Println(ready.Reason, ready.Message)
	}
}

// Await waits for a request someone else sent: here the sender knows only its name. The
// wait ends only on a status written for the object's current generation.
func ExampleAwait() {
	c, err := client.NewWithWatch(ctrl.GetConfigOrDie(), client.Options{Scheme: exampleScheme()})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	book := &libraryv1alpha1.Book{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "ulysses"}}
	if err := ipc.Await(ctx, c, book, ipc.Ready); err != nil {
		log.Fatal(err)
	}
	fmt.Println("done at generation", book.Status.ObservedGeneration)
}

// A handler that creates objects for a request (a volume's replicas, say) carries the
// request's trace onto them, so that their receivers' spans join it. The handler's ctx
// holds the reconcile's span, a child of the sender's; here it is a fixed one.
func ExampleInjectTraceContext() {
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	}))
	sequel := &libraryv1alpha1.Book{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "dune-messiah"},
		Spec:       libraryv1alpha1.BookSpec{Title: "Dune Messiah", Author: "Frank Herbert"},
	}
	ipc.InjectTraceContext(ctx, sequel)
	fmt.Println(sequel.Annotations[ipc.TraceParentAnnotation])
	// Output: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
}

// A controller that is not an ipc receiver continues a request's trace the way receivers
// do: its reconcile is a span whose parent is the sender's span stored on the object.
func ExampleStartSpan() {
	c, err := client.New(ctrl.GetConfigOrDie(), client.Options{Scheme: exampleScheme()})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	book := &libraryv1alpha1.Book{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "emma"}, book); err != nil {
		log.Fatal(err)
	}
	ctx, span := ipc.StartSpan(ctx, nil, "reconcile Book", book)
	defer span.End()
	// The work goes on under ctx: its API calls, and the objects it creates
	// (InjectTraceContext), are in the request's trace.
	book.Status.ObservedGeneration = book.Generation
	if err := c.Status().Update(ctx, book); err != nil {
		log.Fatal(err)
	}
}
