package webhook_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/crdipc/crdipc/internal/scm/webhook"
	"github.com/crdipc/crdipc/internal/testenv"
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

// failWrites fails the writes match selects while armed, as an API server that dies between
// two writes of a delivery would.
type failWrites struct {
	rt    http.RoundTripper
	armed *atomic.Bool
	match func(*http.Request) bool
}

func (f failWrites) RoundTrip(r *http.Request) (*http.Response, error) {
	if f.armed.Load() && f.match(r) {
		return nil, errors.New("connection reset by peer (injected)")
	}
	return f.rt.RoundTrip(r)
}

// failingHarness is a listener whose API writes that match fail while the returned switch is
// on.
func failingHarness(t *testing.T, match func(*http.Request) bool) (*harness, *atomic.Bool) {
	var armed atomic.Bool
	cfg := rest.CopyConfig(testenvConfig(t))
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return failWrites{rt: rt, armed: &armed, match: match} })
	return newHarness(t, cfg), &armed
}

// The object is stored but the Event is not: the answer is 503 (GitHub will show the
// delivery failed), the body has no record, and the redelivery completes the delivery with
// exactly one Event and no change to the object, and records it.
func TestEventWriteFailsThenRedelivery(t *testing.T) {
	h, armed := failingHarness(t, func(r *http.Request) bool {
		return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/events")
	})
	armed.Store(true)
	r := h.deliver("pull_request", deliveryA, fixture(t, "pull_request-opened.json"))
	if r.Status != http.StatusServiceUnavailable || !strings.Contains(r.Error, "is stored but its event is not") {
		t.Fatalf("event write failed: %d %+v", r.Status, r)
	}
	if rec := h.record(fixture(t, "pull_request-opened.json")); rec != nil {
		t.Fatalf("record after a failed Event write: %+v, want none", rec)
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
	if rec := h.record(fixture(t, "pull_request-opened.json")); rec == nil || rec.Status.Result != "unchanged" || rec.Status.EventName != r.EventName {
		t.Errorf("record after the redelivery: %+v, want unchanged with Event %s", rec, r.EventName)
	}
}

// The object and the Event are stored but the record is not: 503, no record (nothing says
// done), and the redelivery, under the same delivery ID or another, records the body without
// writing anything else.
func TestRecordWriteFailsThenRedelivery(t *testing.T) {
	for _, redelivery := range []string{deliveryA, deliveryB} {
		t.Run(redelivery, func(t *testing.T) {
			h, armed := failingHarness(t, func(r *http.Request) bool {
				return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/deliveries")
			})
			body := fixture(t, "create-branch.json")
			armed.Store(true)
			r := h.deliver("create", deliveryA, body)
			if r.Status != http.StatusServiceUnavailable || !strings.Contains(r.Error, "record deliveries/"+webhook.RecordName(body)+" is not") {
				t.Fatalf("record write failed: %d %+v", r.Status, r)
			}
			if rec := h.record(body); rec != nil {
				t.Fatalf("record: %+v, want none", rec)
			}
			if c := h.counts(); c != [3]int{0, 1, 1} {
				t.Fatalf("after the failed record write: %v, want the Branch and its Event", c)
			}
			rv := h.branch(loginBranch).ResourceVersion
			armed.Store(false)
			evName := webhook.EventName(loginBranch, webhook.RecordName(body))
			r = h.mustDeliver("create", redelivery, "create-branch.json", http.StatusOK)
			if r.Result != "duplicate" || r.EventName != evName {
				t.Errorf("redelivery: %+v, want duplicate recorded on %s", r, evName)
			}
			if got := h.branch(loginBranch).ResourceVersion; got != rv {
				t.Errorf("redelivery rewrote the branch: %s → %s", rv, got)
			}
			if c := h.counts(); c != [3]int{0, 1, 1} {
				t.Errorf("after redelivery: %v, want one Branch and one Event", c)
			}
			if rec := h.record(body); rec == nil || rec.Status.Result != "duplicate" || rec.Status.Object != "branches/"+loginBranch ||
				rec.Status.EventName != evName || rec.Spec.DeliveryID != redelivery || rec.Status.CompletedAt == nil {
				t.Errorf("record after the redelivery: %+v, want complete", rec)
			}
		})
	}
}
