package webhook_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
	"github.com/crdipc/crdipc/internal/scm/delivery"
	"github.com/crdipc/crdipc/internal/scm/webhook"
	"github.com/crdipc/crdipc/internal/testenv"
)

const testSecret = "s3cr3t-for-tests"

type harness struct {
	t   testing.TB
	env *testenv.Env
	ns  string
	l   *webhook.Listener
	srv *httptest.Server
	// ops serves the listener's /healthz, /readyz and /metrics, on a port of their own.
	ops *httptest.Server
	// api logs every request the listener (its client and its cache) sends the API server.
	api *requestLog
}

// apiRequest is one request the listener sent the API server.
type apiRequest struct {
	method, path string
	watch        bool
}

func (r apiRequest) String() string { return r.method + " " + r.path }

// requestLog records the requests of a rest.Config's transport (rest.Config.Wrap): the
// listener's client and cache are built from its Options.Config, so this is every request
// it makes, counted on the wire.
type requestLog struct {
	mu   sync.Mutex
	reqs []apiRequest
}

type loggingTransport struct {
	rt  http.RoundTripper
	log *requestLog
}

func (t loggingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	t.log.mu.Lock()
	t.log.reqs = append(t.log.reqs, apiRequest{method: r.Method, path: r.URL.Path, watch: r.URL.Query().Get("watch") == "true"})
	t.log.mu.Unlock()
	return t.rt.RoundTrip(r)
}

// during runs f and returns the requests the listener sent meanwhile, except watches (the
// cache's, which it keeps open and renews).
func (h *harness) during(f func()) []apiRequest {
	h.api.mu.Lock()
	n := len(h.api.reqs)
	h.api.mu.Unlock()
	f()
	h.api.mu.Lock()
	defer h.api.mu.Unlock()
	var out []apiRequest
	for _, r := range h.api.reqs[n:] {
		if !r.watch {
			out = append(out, r)
		}
	}
	return out
}

// newHarness starts a listener for a fresh namespace behind a real HTTP server, with its
// cache started as Run does. cfg, when given, replaces the test environment's API server
// config (to reach it through a proxy).
func newHarness(t testing.TB, cfg *rest.Config, mod ...func(*webhook.Options)) *harness {
	t.Helper()
	h := newUnstartedHarness(t, cfg, mod...)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := h.l.Start(ctx); err != nil {
		t.Fatalf("starting listener cache: %v", err)
	}
	return h
}

// newUnstartedHarness is newHarness without the cache: every read goes to the API server.
func newUnstartedHarness(t testing.TB, cfg *rest.Config, mod ...func(*webhook.Options)) *harness {
	t.Helper()
	env := testenv.Get(t)
	ns := env.Namespace(t)
	if cfg == nil {
		// The listener's own ServiceAccount, with the role its markers generate, bound in
		// the test's namespace as config/rbac/webhook-listener binds it in crdipc-scm.
		cfg = env.AsServiceAccount(t, "webhook-listener", ns)
	}
	api := &requestLog{}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return loggingTransport{rt: rt, log: api} })
	opts := webhook.Options{
		Config:    cfg,
		Namespace: ns,
		Secret:    []byte(testSecret),
		Instance:  "test-instance",
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, m := range mod {
		m(&opts)
	}
	l, err := webhook.New(opts)
	if err != nil {
		t.Fatalf("webhook.New: %v", err)
	}
	// Served as Setup serves it: behind the listener's connection limit.
	srv := httptest.NewUnstartedServer(l.Handler())
	srv.Listener = l.LimitListener(srv.Listener)
	srv.Start()
	t.Cleanup(srv.Close)
	ops := httptest.NewServer(l.OpsHandler())
	t.Cleanup(ops.Close)
	// A delivery that hangs fails its test instead of the whole run.
	srv.Client().Timeout = 20 * time.Second
	return &harness{t: t, env: env, ns: ns, l: l, srv: srv, ops: ops, api: api}
}

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type reply struct {
	Status    int    `json:"-"`
	Delivery  string `json:"delivery"`
	Event     string `json:"event"`
	Result    string `json:"result"`
	Object    string `json:"object"`
	EventName string `json:"eventName"`
	Message   string `json:"message"`
	Error     string `json:"error"`
}

// request builds a GitHub-like delivery, signed with testSecret.
func (h *harness) request(event, id string, body []byte) *http.Request {
	req, err := delivery.New(context.Background(), h.srv.URL+"/webhook", []byte(testSecret), event, id, body)
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("User-Agent", "GitHub-Hookshot/abc1234")
	req.Header.Set("X-GitHub-Hook-ID", "109948940")
	return req
}

func (h *harness) do(req *http.Request) reply {
	h.t.Helper()
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		h.t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var r reply
	if err := json.Unmarshal(raw, &r); err != nil {
		h.t.Fatalf("answer %d is not JSON: %v: %q", resp.StatusCode, err, raw)
	}
	r.Status = resp.StatusCode
	return r
}

func (h *harness) deliver(event, delivery string, body []byte) reply {
	h.t.Helper()
	return h.do(h.request(event, delivery, body))
}

// mustDeliver delivers a fixture and fails unless the answer has want status.
func (h *harness) mustDeliver(event, delivery, file string, want int) reply {
	h.t.Helper()
	r := h.deliver(event, delivery, fixture(h.t, file))
	if r.Status != want {
		h.t.Fatalf("%s %s (%s): status %d %+v, want %d", event, delivery, file, r.Status, r, want)
	}
	return r
}

func (h *harness) pullRequest(name string) *scmv1alpha1.PullRequest {
	h.t.Helper()
	pr := &scmv1alpha1.PullRequest{}
	if err := h.env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: name}, pr); err != nil {
		h.t.Fatalf("get pullrequest %s: %v", name, err)
	}
	return pr
}

func (h *harness) branch(name string) *scmv1alpha1.Branch {
	h.t.Helper()
	b := &scmv1alpha1.Branch{}
	if err := h.env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: name}, b); err != nil {
		h.t.Fatalf("get branch %s: %v", name, err)
	}
	return b
}

func (h *harness) events() []corev1.Event {
	h.t.Helper()
	var l corev1.EventList
	if err := h.env.Client.List(context.Background(), &l, client.InNamespace(h.ns)); err != nil {
		h.t.Fatalf("list events: %v", err)
	}
	return l.Items
}

// counts is how many PullRequests, Branches and Events the namespace holds.
func (h *harness) counts() [3]int {
	h.t.Helper()
	ctx := context.Background()
	var prs scmv1alpha1.PullRequestList
	var brs scmv1alpha1.BranchList
	if err := h.env.Client.List(ctx, &prs, client.InNamespace(h.ns)); err != nil {
		h.t.Fatal(err)
	}
	if err := h.env.Client.List(ctx, &brs, client.InNamespace(h.ns)); err != nil {
		h.t.Fatal(err)
	}
	return [3]int{len(prs.Items), len(brs.Items), len(h.events())}
}

func testenvConfig(t testing.TB) *rest.Config { return testenv.Get(t).Config }

// record returns the Delivery record of body, or nil when there is none.
func (h *harness) record(body []byte) *scmv1alpha1.Delivery {
	h.t.Helper()
	rec := &scmv1alpha1.Delivery{}
	err := h.env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: webhook.RecordName(body)}, rec)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		h.t.Fatalf("get delivery record: %v", err)
	}
	return rec
}
