package ipc_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/ipc"
)

// shelfHandler files a Book only once a ConfigMap of the same name says "shelf: free",
// and keeps a deleted Book until that ConfigMap is gone: a request that depends on
// another object, in both directions.
type shelfHandler struct{ c client.Client }

func (h shelfHandler) Handle(ctx context.Context, b *libraryv1alpha1.Book) (ipc.Result, error) {
	var cm corev1.ConfigMap
	err := h.c.Get(ctx, client.ObjectKeyFromObject(b), &cm)
	if err != nil && !apierrors.IsNotFound(err) {
		return ipc.Result{}, err
	}
	if err != nil || cm.Data["shelf"] != "free" {
		// No RequeueAfter: only the ConfigMap watch can wake this request up.
		return ipc.Waiting(conditions.ReasonWaiting, "waiting for a free shelf", 0), nil
	}
	return ipc.Done("shelved"), nil
}

func (h shelfHandler) Finalize(ctx context.Context, b *libraryv1alpha1.Book) error {
	err := h.c.Get(ctx, client.ObjectKeyFromObject(b), &corev1.ConfigMap{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return ipc.Deleting("waiting for the shelf to be cleared", 0)
}

func TestWatchesWakeRequestsAndDeletingWaits(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 scheme.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	err = ipc.Register(mgr, &libraryv1alpha1.Book{}, ipc.Handler[*libraryv1alpha1.Book](shelfHandler{c: mgr.GetClient()}), ipc.Options{
		Name: "book-shelf", LeaseDuration: -1,
		Watches: []ipc.Watch{{
			Object: &corev1.ConfigMap{},
			Map: func(_ context.Context, o client.Object) []reconcile.Request {
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: o.GetName()}}}
			},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(mctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })

	b := &libraryv1alpha1.Book{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dune"},
		Spec:       libraryv1alpha1.BookSpec{Title: "Dune", Author: "Frank Herbert"},
	}
	if err := env.Client.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	readyReason := func(reason string) func(context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			var got libraryv1alpha1.Book
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(b), &got); err != nil {
				return false, err
			}
			c := meta.FindStatusCondition(got.Status.Conditions, conditions.TypeReady)
			if c == nil || c.Reason != reason || c.ObservedGeneration != got.Generation {
				return false, fmt.Errorf("Ready %+v at generation %d", c, got.Generation)
			}
			return true, nil
		}
	}
	testenv.Eventually(t, 10*time.Second, "book Waiting", readyReason(conditions.ReasonWaiting))

	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dune"}, Data: map[string]string{"shelf": "free"}}
	if err := env.Client.Create(ctx, cm); err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	defer acancel()
	if err := ipc.Await(actx, env.Client, b, ipc.Ready); err != nil {
		t.Fatalf("the ConfigMap did not wake the book: %v", err)
	}

	if err := env.Client.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "deleted book reports Deleting", readyReason(conditions.ReasonDeleting))
	if err := env.Client.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "book released once its ConfigMap went", gone(t, b))
}
