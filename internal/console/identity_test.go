package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
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
	"github.com/crdipc/crdipc/internal/tracing"
)

func TestMain(m *testing.M) { testenv.Main(m) }

const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"

func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// TestReadOnlyAccount: the console runs as its ServiceAccount, crdipc-console, as in
// `crdipc up`: its role lets it list and watch every kind the page shows (the snapshot is
// served), and nothing else: a create or a delete with its credentials is Forbidden. The
// Book (created as admin) shows in flight with the trace ID of its annotation.
func TestReadOnlyAccount(t *testing.T) {
	env := testenv.Get(t)
	cfg := env.AsServiceAccount(t, "console")
	// A nil store, as up holds when tracing is off: the console must not call it.
	con, err := console.New(console.Options{Config: cfg, Logger: logr.Discard(), Traces: (*tracing.Store)(nil)})
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
	book := &libraryv1alpha1.Book{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "b", Annotations: map[string]string{
		"tracing.k8s.io/traceparent": "00-" + traceID + "-00f067aa0ba902b7-01",
	}}, Spec: libraryv1alpha1.BookSpec{Title: "t", Author: "a"}}
	if err := c.Create(ctx, book); !apierrors.IsForbidden(err) {
		t.Errorf("creating a Book as the console: %v, want Forbidden", err)
	}
	if err := env.Client.Create(ctx, book); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, book); !apierrors.IsForbidden(err) {
		t.Errorf("deleting a Book as the console: %v, want Forbidden", err)
	}
	// No receiver runs: the Book stays in flight, its trace ID read from its annotation
	// (through the cache's slimmed copy).
	testenv.Eventually(t, 30*time.Second, "the Book in flight with its trace ID", func(ctx context.Context) (bool, error) {
		var s console.Snapshot
		if err := getJSON(ctx, srv.URL+"/state", &s); err != nil {
			return false, err
		}
		for _, r := range s.InFlight {
			if r.Namespace == ns && r.Name == "b" {
				if r.TraceID != traceID || s.Tracing {
					return false, fmt.Errorf("in flight %+v, tracing %v; want trace %s, tracing off", r, s.Tracing, traceID)
				}
				return true, nil
			}
		}
		return false, fmt.Errorf("%s/b not in flight: %+v", ns, s.InFlight)
	})
	resp, err := http.Get(srv.URL + "/traces/" + traceID)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /traces/<id> with tracing off: %s, want 404", resp.Status)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}}
	if err := c.DeleteAllOf(ctx, pod, client.InNamespace(ns)); !apierrors.IsForbidden(err) {
		t.Errorf("deleting pods as the console: %v, want Forbidden", err)
	}
}
