package ipc_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/ipc"
)

// exampleNamespace gives each example its own namespace on the package's
// embedded API server.
func exampleNamespace(ctx context.Context) string {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "example-"}}
	if err := testenv.Current().Client.Create(ctx, ns); err != nil {
		panic(err)
	}
	return ns.Name
}

var receiverOnce sync.Once

// startBookReceiver runs a receiver as a service would: a manager with one
// handler. The examples share it; it stops with the test binary.
func startBookReceiver() {
	receiverOnce.Do(runBookReceiver)
}

func runBookReceiver() {
	env := testenv.Current()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 scheme.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		panic(err)
	}
	err = ipc.Register(mgr, &libraryv1alpha1.Book{}, ipc.HandlerFunc[*libraryv1alpha1.Book](
		func(ctx context.Context, b *libraryv1alpha1.Book) (ipc.Result, error) {
			if b.Spec.Author == "" {
				return ipc.Result{}, ipc.InvalidSpec("a book needs an author")
			}
			return ipc.Done(fmt.Sprintf("catalogued %q", b.Spec.Title)), nil
		}), ipc.Options{Name: "example-book"})
	if err != nil {
		panic(err)
	}
	go func() { _ = mgr.Start(context.Background()) }()
}

// A receiver is a handler for one kind, registered on a controller-runtime
// manager; ipc writes observedGeneration, the Ready condition and an Event.
// A sender sends with Call and gets the reply in the object's status.
func ExampleRegister() {
	startBookReceiver()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	book := &libraryv1alpha1.Book{
		ObjectMeta: metav1.ObjectMeta{Namespace: exampleNamespace(ctx), Name: "dune"},
		Spec:       libraryv1alpha1.BookSpec{Title: "Dune", Author: "Frank Herbert"},
	}
	if err := ipc.Call(ctx, testenv.Current().Client, book, ipc.Ready); err != nil {
		fmt.Println("call failed:", err)
		return
	}
	ready := meta.FindStatusCondition(book.Status.Conditions, conditions.TypeReady)
	fmt.Println(ready.Status, ready.Reason, ready.Message)
	// Output: True Succeeded catalogued "Dune"
}

// Call creates the request and waits for the reply; Ready=False with a
// terminal reason comes back as a *TerminalError.
func ExampleCall() {
	startBookReceiver()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	env := testenv.Current()
	book := &libraryv1alpha1.Book{
		ObjectMeta: metav1.ObjectMeta{Namespace: exampleNamespace(ctx), Name: "emma"},
		Spec:       libraryv1alpha1.BookSpec{Title: "Emma", Author: "Jane Austen"},
	}
	err := ipc.Call(ctx, env.Client, book, ipc.Ready, ipc.WithServerSideApply("example"))
	fmt.Println("first call:", err)
	// Applying the same request again is idempotent: same object, same reply.
	err = ipc.Call(ctx, env.Client, book, ipc.Ready, ipc.WithServerSideApply("example"))
	fmt.Println("second call:", err, "generation", book.Generation)
	// Output:
	// first call: <nil>
	// second call: <nil> generation 1
}

// Await waits for an object someone else created: here the sender only
// knows its name. The wait ends only on a status written for the object's
// current generation.
func ExampleAwait() {
	startBookReceiver()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	env := testenv.Current()
	ns := exampleNamespace(ctx)
	if err := env.Client.Create(ctx, &libraryv1alpha1.Book{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ulysses"},
		Spec:       libraryv1alpha1.BookSpec{Title: "Ulysses", Author: "James Joyce"},
	}); err != nil {
		panic(err)
	}

	book := &libraryv1alpha1.Book{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ulysses"}}
	err := ipc.Await(ctx, env.Client, book, ipc.Ready)
	fmt.Println(err, book.Status.ObservedGeneration == book.Generation)
	// Output: <nil> true
}
