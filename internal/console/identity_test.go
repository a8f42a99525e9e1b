package console_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/internal/console"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// TestReadOnlyAccount: the console runs as its ServiceAccount, crdipc-console, as in
// `crdipc up`: its role lets it list and watch every kind the page shows (the snapshot is
// served), and nothing else: a create or a delete with its credentials is Forbidden.
func TestReadOnlyAccount(t *testing.T) {
	env := testenv.Get(t)
	cfg := env.AsServiceAccount(t, "console")
	con, err := console.New(console.Options{Config: cfg, Logger: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "console", con.Start)
	srv := httptest.NewServer(con)
	t.Cleanup(srv.Close)
	// A role that misses a kind the page shows never syncs, so never serves a snapshot.
	wait.Eventually(t, 30*time.Second, "the console's first snapshot", wait.HTTPOK(srv.URL+"/state"))

	c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		t.Errorf("listing Nodes as the console: %v", err)
	}
	var books libraryv1alpha1.BookList
	if err := c.List(ctx, &books); err != nil {
		t.Errorf("listing Books as the console: %v", err)
	}
	ns := env.Namespace(t)
	book := &libraryv1alpha1.Book{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b"}, Spec: libraryv1alpha1.BookSpec{Title: "t", Author: "a"}}
	if err := c.Create(ctx, book); !apierrors.IsForbidden(err) {
		t.Errorf("creating a Book as the console: %v, want Forbidden", err)
	}
	if err := env.Client.Create(ctx, book); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, book); !apierrors.IsForbidden(err) {
		t.Errorf("deleting a Book as the console: %v, want Forbidden", err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}}
	if err := c.DeleteAllOf(ctx, pod, client.InNamespace(ns)); !apierrors.IsForbidden(err) {
		t.Errorf("deleting pods as the console: %v, want Forbidden", err)
	}
}
