package controlplane_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/internal/controlplane"
	"github.com/crdipc/crdipc/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func book(ns, name string) *libraryv1alpha1.Book {
	return &libraryv1alpha1.Book{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       libraryv1alpha1.BookSpec{Title: "Dune", Author: "Frank Herbert"},
	}
}

func gone(c client.Client, obj client.Object) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return false, fmt.Errorf("%s still exists (deletionTimestamp %v, finalizers %v)", obj.GetName(), obj.GetDeletionTimestamp(), obj.GetFinalizers())
	}
}

func TestSecondStartOnSameDataDirFails(t *testing.T) {
	env := testenv.Get(t)
	_, err := controlplane.Start(context.Background(), controlplane.Config{DataDir: env.DataDir()})
	if !errors.Is(err, controlplane.ErrDataDirInUse) {
		t.Fatalf("second Start on a data dir in use: got %v, want ErrDataDirInUse", err)
	}
}

func TestStatusSubresourceSeparatesSpecAndStatus(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	b := book(ns, "status")
	if err := env.Client.Create(ctx, b); err != nil {
		t.Fatal(err)
	}

	// A status write through the main resource is ignored...
	b.Status.ObservedGeneration = 7
	b.Spec.Title = "Dune Messiah"
	if err := env.Client.Update(ctx, b); err != nil {
		t.Fatal(err)
	}
	if b.Status.ObservedGeneration != 0 || b.Spec.Title != "Dune Messiah" || b.Generation != 2 {
		t.Fatalf("update of main resource: status %+v, title %q, generation %d; want status untouched, title changed, generation 2", b.Status, b.Spec.Title, b.Generation)
	}

	// ...and a spec change through /status is ignored.
	b.Spec.Title = "Children of Dune"
	b.Status.ObservedGeneration = 2
	b.Status.Conditions = []metav1.Condition{{Type: conditions.TypeReady, Status: metav1.ConditionTrue, Reason: conditions.ReasonSucceeded, LastTransitionTime: metav1.Now()}}
	if err := env.Client.Status().Update(ctx, b); err != nil {
		t.Fatal(err)
	}
	if b.Spec.Title != "Dune Messiah" || b.Status.ObservedGeneration != 2 || b.Generation != 2 {
		t.Fatalf("update of status: title %q, observedGeneration %d, generation %d; want title kept, status written, generation unchanged", b.Spec.Title, b.Status.ObservedGeneration, b.Generation)
	}
}

func TestOwnerReferenceCascade(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	for _, policy := range []metav1.DeletionPropagation{metav1.DeletePropagationBackground, metav1.DeletePropagationForeground} {
		t.Run(string(policy), func(t *testing.T) {
			owner := book(ns, "owner-"+strings.ToLower(string(policy)))
			if err := env.Client.Create(ctx, owner); err != nil {
				t.Fatal(err)
			}
			child := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
				Namespace: ns, Name: owner.Name + "-child",
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: libraryv1alpha1.GroupVersion.String(), Kind: "Book",
					Name: owner.Name, UID: owner.UID, BlockOwnerDeletion: ptr(true),
				}},
			}}
			if err := env.Client.Create(ctx, child); err != nil {
				t.Fatal(err)
			}
			if err := env.Client.Delete(ctx, owner, client.PropagationPolicy(policy)); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, 30*time.Second, "child deleted by the garbage collector", gone(env.Client, child))
			testenv.Eventually(t, 30*time.Second, "owner deleted", gone(env.Client, owner))
		})
	}
}

func TestNamespaceDeletionCompletes(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "doomed-"}}
	if err := env.Client.Create(ctx, nsObj); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b", "c"} {
		if err := env.Client.Create(ctx, book(nsObj.Name, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.Client.Delete(ctx, nsObj); err != nil {
		t.Fatal(err)
	}
	// The namespace controller waits a fixed grace period before it empties
	// a namespace; a minute is far above it.
	testenv.Eventually(t, time.Minute, "namespace with Books in it deleted", gone(env.Client, nsObj))
	var left libraryv1alpha1.BookList
	if err := env.Client.List(ctx, &left, client.InNamespace(nsObj.Name)); err != nil {
		t.Fatal(err)
	}
	if len(left.Items) != 0 {
		t.Fatalf("%d Books left in deleted namespace", len(left.Items))
	}
}

// TestRestartKeepsObjects must run last among tests that hold objects: it
// stops and starts the control plane on the same data directory.
func TestRestartKeepsObjects(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	b := book(ns, "durable")
	if err := env.Client.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	env.Restart(t)
	env = testenv.Get(t)
	var got libraryv1alpha1.Book
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(b), &got); err != nil {
		t.Fatalf("Book after restart: %v", err)
	}
	if got.UID != b.UID || got.Spec != b.Spec {
		t.Fatalf("Book after restart = %+v (uid %s), want %+v (uid %s)", got.Spec, got.UID, b.Spec, b.UID)
	}
	// The restarted control plane is fully working, controllers included.
	if err := env.Client.Delete(ctx, &got); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "Book deleted after restart", gone(env.Client, &got))
}

func ptr[T any](v T) *T { return &v }

// The API server decodes custom resources with their managedFields trees shared between
// objects (fieldsets.go). Ownership must still be each object's own: taking a field of one
// Book by force changes who owns it in that Book only, and the other, whose trees were the
// same copy, still reports a conflict for the same change.
func TestFieldOwnershipIsPerObject(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	apply := func(name, title string, owner string, opts ...client.ApplyOption) error {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": libraryv1alpha1.GroupVersion.String(), "kind": "Book",
			"metadata": map[string]any{"namespace": ns, "name": name},
			"spec":     map[string]any{"title": title, "author": "Frank Herbert"},
		}}
		if owner == "bob" {
			unstructured.RemoveNestedField(u.Object, "spec", "author")
		}
		return env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), append(opts, client.FieldOwner(owner))...)
	}
	for _, name := range []string{"one", "two"} {
		if err := apply(name, "Dune", "alice"); err != nil {
			t.Fatal(err)
		}
	}
	if err := apply("one", "Dune Messiah", "bob", client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	if err := apply("two", "Dune Messiah", "bob"); !apierrors.IsConflict(err) {
		t.Fatalf("bob's apply of a title alice owns in two: got %v, want a conflict", err)
	}

	// fields lists, per manager, the spec fields it owns.
	fields := func(b *libraryv1alpha1.Book) map[string][]string {
		owned := map[string][]string{}
		for _, e := range b.ManagedFields {
			var tree map[string]map[string]any
			if err := json.Unmarshal(e.FieldsV1.Raw, &tree); err != nil {
				t.Fatal(err)
			}
			for f := range tree["f:spec"] {
				if f != "." {
					owned[e.Manager] = append(owned[e.Manager], f)
				}
			}
			sort.Strings(owned[e.Manager])
		}
		return owned
	}
	want := map[string]map[string][]string{
		"one": {"alice": {"f:author"}, "bob": {"f:title"}},
		"two": {"alice": {"f:author", "f:title"}},
	}
	// A Get, and a List served from the watch cache: both decode what etcd holds.
	list := &libraryv1alpha1.BookList{}
	if err := env.Client.List(ctx, list, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: "0"}}); err != nil {
		t.Fatal(err)
	}
	for _, b := range list.Items {
		if got := fields(&b); !reflect.DeepEqual(got, want[b.Name]) {
			t.Errorf("listed %s: owners of spec fields %v, want %v", b.Name, got, want[b.Name])
		}
		got := &libraryv1alpha1.Book{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(&b), got); err != nil {
			t.Fatal(err)
		}
		if got := fields(got); !reflect.DeepEqual(got, want[b.Name]) {
			t.Errorf("got %s: owners of spec fields %v, want %v", b.Name, got, want[b.Name])
		}
	}
	if len(list.Items) != 2 {
		t.Errorf("listed %d Books, want 2", len(list.Items))
	}
}
