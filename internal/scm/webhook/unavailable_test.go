package webhook_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/crdipc/crdipc/internal/testenv"
	"k8s.io/client-go/rest"
)

// API server unreachable → 503 with a reason and Retry-After, nothing written; reachable
// again → GitHub's redelivery of the same delivery succeeds, once.
func TestAPIServerUnavailable(t *testing.T) {
	proxy, cfg := testenv.NewAPIProxy(t, testenvConfig(t))
	h := newHarness(t, cfg) // h.counts() and friends use the test's own, direct client

	proxy.Down()
	req := h.request("pull_request", deliveryA, fixture(t, "pull_request-opened.json"))
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(string(body), "API server unavailable") {
		t.Fatalf("with the API server down: %d %s (Retry-After %q)", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	if c := h.counts(); c != [3]int{} {
		t.Fatalf("API server down, yet objects exist: %v", c)
	}
	// The listener's readiness follows the API server.
	if r, err := h.ops.Client().Get(h.ops.URL + "/readyz"); err != nil || r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz with API server down: %v %v", r, err)
	}

	proxy.Up()
	if r := h.mustDeliver("pull_request", deliveryA, "pull_request-opened.json", http.StatusOK); r.Result != "created" {
		t.Errorf("redelivery after the API server is back: %+v", r)
	}
	if c := h.counts(); c != [3]int{1, 0, 1} {
		t.Errorf("after redelivery: %v, want one PullRequest and one Event", c)
	}
	if r, err := h.ops.Client().Get(h.ops.URL + "/readyz"); err != nil || r.StatusCode != http.StatusOK {
		t.Errorf("/readyz with API server up: %v %v", r, err)
	}
}

// failEvents fails Event creates while armed, as an API server that dies between the two
// writes of a delivery would.
type failEvents struct {
	rt    http.RoundTripper
	armed *atomic.Bool
}

func (f failEvents) RoundTrip(r *http.Request) (*http.Response, error) {
	if f.armed.Load() && r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/events") {
		return nil, errors.New("connection reset by peer (injected)")
	}
	return f.rt.RoundTrip(r)
}

// The object is stored but the Event is not: the answer is 503 (GitHub will show the
// delivery failed), and the redelivery completes it with exactly one Event and no change to
// the object.
func TestEventWriteFailsThenRedelivery(t *testing.T) {
	var armed atomic.Bool
	cfg := rest.CopyConfig(testenvConfig(t))
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return failEvents{rt: rt, armed: &armed} })
	h := newHarness(t, cfg)
	armed.Store(true)
	r := h.deliver("pull_request", deliveryA, fixture(t, "pull_request-opened.json"))
	if r.Status != http.StatusServiceUnavailable || !strings.Contains(r.Error, "is stored but its event is not") {
		t.Fatalf("event write failed: %d %+v", r.Status, r)
	}
	rv := h.pullRequest(pr42).ResourceVersion
	armed.Store(false)
	r = h.mustDeliver("pull_request", deliveryA, "pull_request-opened.json", http.StatusOK)
	if r.Result != "unchanged" {
		t.Errorf("redelivery: %q, want unchanged (the object was already stored)", r.Result)
	}
	if got := h.pullRequest(pr42).ResourceVersion; got != rv {
		t.Errorf("redelivery rewrote the object: %s → %s", rv, got)
	}
	if c := h.counts(); c != [3]int{1, 0, 1} {
		t.Errorf("after redelivery: %v, want one PullRequest and one Event", c)
	}
}
