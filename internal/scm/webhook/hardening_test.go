package webhook_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
	"github.com/crdipc/crdipc/internal/scm/webhook"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/metrics"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// heldDelivery is a signed delivery whose body is sent up to its first byte and then held,
// so that the listener holds it in flight, reading.
type heldDelivery struct {
	body  []byte
	pw    *io.PipeWriter
	first chan struct{} // closed once the first byte is sent, or refused
	done  chan reply
}

func (h *harness) hold(event, delivery string, body []byte) *heldDelivery {
	h.t.Helper()
	pr, pw := io.Pipe()
	req := h.request(event, delivery, body)
	req.Body, req.ContentLength = pr, -1 // chunked, so the body can be held
	d := &heldDelivery{body: body, pw: pw, first: make(chan struct{}), done: make(chan reply, 1)}
	// A test that stops early must not leave the request held: the server's Close waits for it.
	h.t.Cleanup(func() { pw.CloseWithError(errors.New("test ended")) })
	go func() {
		defer pr.Close()
		resp, err := h.srv.Client().Do(req)
		if err != nil {
			d.done <- reply{Error: "POST: " + err.Error()}
			return
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		d.done <- reply{Status: resp.StatusCode, Error: resp.Header.Get("Retry-After") + "|" + string(raw)}
	}()
	// The first byte may never be taken: a listener that answers before reading the body
	// closes the request.
	go func() {
		defer close(d.first)
		_, _ = pw.Write(body[:1])
	}()
	return d
}

// finish sends the rest of the body and returns the answer.
func (d *heldDelivery) finish(t *testing.T) reply {
	t.Helper()
	<-d.first
	if _, err := d.pw.Write(d.body[1:]); err != nil {
		t.Fatalf("sending the rest of the body: %v", err)
	}
	d.pw.Close()
	return d.wait(t)
}

func (d *heldDelivery) wait(t *testing.T) reply {
	t.Helper()
	select {
	case r := <-d.done:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("no answer within 30s")
		return reply{}
	}
}

func (h *harness) inFlight() float64 {
	v, _ := metrics.Gather(h.t, h.l.Registry()).Sample("crdipc_webhook_requests_in_flight", nil)
	return v
}

// With MaxConcurrentRequests deliveries in flight, one more is answered 503 with Retry-After
// and a reason, without its body being read: its body never arrives, and the answer does.
func TestOverloaded(t *testing.T) {
	h := newHarness(t, nil, func(o *webhook.Options) { o.MaxConcurrentRequests = 2 })
	held := []*heldDelivery{
		h.hold("pull_request", deliveryA, fixture(t, "pull_request-opened.json")),
		h.hold("pull_request", deliveryB, fixture(t, "pull_request-closed.json")),
	}
	wait.Eventually(t, 30*time.Second, "two deliveries in flight", func(context.Context) (bool, error) {
		return h.inFlight() == 2, nil
	})

	over := h.hold("pull_request", deliveryC, fixture(t, "pull_request-reopened.json"))
	r := over.wait(t)
	retryAfter, body, _ := strings.Cut(r.Error, "|")
	if r.Status != http.StatusServiceUnavailable || retryAfter == "" ||
		!strings.Contains(body, `"result":"overloaded"`) || !strings.Contains(body, "--max-concurrent-requests") {
		t.Fatalf("third delivery with two in flight: %d Retry-After %q %s", r.Status, retryAfter, body)
	}
	over.pw.Close()

	for _, d := range held {
		if r := d.finish(t); r.Status != http.StatusOK {
			t.Errorf("held delivery: %d %s", r.Status, r.Error)
		}
	}
	if got := h.inFlight(); got != 0 {
		t.Errorf("%v deliveries in flight after all were answered", got)
	}
	if c := h.counts(); c != [3]int{2, 0, 2} {
		t.Errorf("after two stored and one refused delivery: %v, want 2 PullRequests and 2 Events", c)
	}
	// Room again: the refused delivery, redelivered, is stored.
	if r := h.mustDeliver("pull_request", deliveryC, "pull_request-reopened.json", http.StatusOK); r.Result != "updated" {
		t.Errorf("redelivery of the refused delivery: %+v", r)
	}
	mfs := metrics.Gather(t, h.l.Registry())
	if v, _ := mfs.Sample("crdipc_webhook_deliveries_total", map[string]string{"event": "pull_request", "result": "overloaded"}); v != 1 {
		t.Errorf("overloaded deliveries counted %v, want 1", v)
	}
}

// With MaxConnections open, the listener accepts no further connection until one closes.
func TestConnectionLimit(t *testing.T) {
	h := newHarness(t, nil, func(o *webhook.Options) { o.MaxConnections = 1 })
	idle, err := net.Dial("tcp", h.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	// The idle connection was accepted first and holds the only slot, so this request's
	// connection is never accepted: its deadline passes unanswered. (Without the limit it
	// is answered within milliseconds.)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	req := h.request("ping", deliveryA, fixture(t, "ping.json")).WithContext(ctx)
	if resp, err := tr.RoundTrip(req); err == nil {
		resp.Body.Close()
		t.Fatalf("request with the only connection taken: answered %d, want no answer before its deadline", resp.StatusCode)
	} else if ctx.Err() == nil {
		t.Fatalf("request with the only connection taken: %v, want no answer before its deadline", err)
	}
	idle.Close()
	wait.Eventually(t, 30*time.Second, "a request once the idle connection is closed", func(context.Context) (bool, error) {
		req := h.request("ping", deliveryA, fixture(t, "ping.json"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// The acceptance: a redelivery of a recorded delivery after its Event is deleted (the
// API server deletes Events after an hour; GitHub redelivers for days) creates nothing. And a
// recorded delivery ID under another body is refused.
func TestRedeliveryAfterEventDeleted(t *testing.T) {
	bothModes(t, testRedeliveryAfterEventDeleted)
}

func testRedeliveryAfterEventDeleted(t *testing.T, h *harness) {
	body := fixture(t, "create-branch.json")
	first := h.mustDeliver("create", deliveryA, "create-branch.json", http.StatusOK)
	rec := h.record(body)
	if rec == nil || rec.Spec.DeliveryID != deliveryA || rec.Spec.Event != "create" || rec.Spec.ReceivedAt.IsZero() ||
		rec.Status.Result != "created" || rec.Status.Object != first.Object || rec.Status.EventName != first.EventName || rec.Status.CompletedAt == nil {
		t.Fatalf("record of the delivery: %+v", rec)
	}
	if err := h.env.Client.DeleteAllOf(context.Background(), &corev1.Event{}, client.InNamespace(h.ns)); err != nil {
		t.Fatal(err)
	}
	if n := len(h.events()); n != 0 {
		t.Fatalf("%d Events left after deleting them", n)
	}
	rv := h.branch(loginBranch).ResourceVersion

	r := h.mustDeliver("create", deliveryA, "create-branch.json", http.StatusOK)
	if r.Result != "duplicate" || r.Object != first.Object || r.EventName != first.EventName || !strings.Contains(r.Message, rec.Name) {
		t.Errorf("redelivery after its Event is gone: %+v, want duplicate of %s", r, first.EventName)
	}
	// Another body under the recorded delivery ID: refused, with the reason.
	r = h.mustDeliver("push", deliveryA, "push.json", http.StatusConflict)
	if !strings.Contains(r.Error, "received before with another body") || !strings.Contains(r.Error, rec.Name) {
		t.Errorf("another body under a recorded delivery ID: %+v", r)
	}
	if c := h.counts(); c != [3]int{0, 1, 0} {
		t.Errorf("after the redelivery and the conflicting body: %v, want the Branch alone", c)
	}
	if got := h.branch(loginBranch).ResourceVersion; got != rv {
		t.Errorf("the branch was rewritten: %s → %s", rv, got)
	}
	if got := h.record(body); got == nil || got.ResourceVersion != rec.ResourceVersion {
		t.Errorf("the record changed: %+v", got)
	}
	if h.record(fixture(t, "push.json")) != nil {
		t.Error("the refused body was recorded")
	}
}

// A captured signed body resent under a new delivery ID, or as another event (the
// X-GitHub-Event header is not signed), changes nothing: a create replayed as a delete does
// not mark its branch deleted, while its record lasts and after.
func TestHeaderSwappedReplay(t *testing.T) {
	bothModes(t, testHeaderSwappedReplay)
}

func testHeaderSwappedReplay(t *testing.T, h *harness) {
	body := fixture(t, "create-branch.json")
	first := h.mustDeliver("create", deliveryA, "create-branch.json", http.StatusOK)
	rv := h.branch(loginBranch).ResourceVersion

	r := h.mustDeliver("delete", deliveryE, "create-branch.json", http.StatusConflict)
	if !strings.Contains(r.Error, `received as a "create" event`) || !strings.Contains(r.Error, deliveryA) {
		t.Errorf("create body replayed as delete: %+v", r)
	}
	r = h.mustDeliver("create", deliveryE, "create-branch.json", http.StatusOK)
	if r.Result != "duplicate" || r.EventName != first.EventName || !strings.Contains(r.Message, "same body as delivery "+deliveryA) {
		t.Errorf("create body under a new delivery ID: %+v, want duplicate of %s", r, deliveryA)
	}
	checkBranch(t, h.branch(loginBranch), scmv1alpha1.BranchCreated, "", "2026-03-02T10:00:00Z")
	if got := h.branch(loginBranch).ResourceVersion; got != rv {
		t.Errorf("replays rewrote the branch: %s → %s", rv, got)
	}
	if c := h.counts(); c != [3]int{0, 1, 1} {
		t.Errorf("after the replays: %v, want the Branch and its one Event", c)
	}

	// A create body without a record (one past the retention: the listener never saw this
	// one) replayed as a delete: the body itself says it is not a delete.
	unrecorded := []byte(strings.Replace(string(body), `"login": "mona"`, `"login": "hubot"`, 1))
	r = h.deliver("delete", "replay-after-retention", unrecorded)
	if r.Status != http.StatusBadRequest || !strings.Contains(r.Error, "create payload delivered as delete") {
		t.Errorf("create body replayed as delete without a record: %d %+v", r.Status, r)
	}
	checkBranch(t, h.branch(loginBranch), scmv1alpha1.BranchCreated, "", "2026-03-02T10:00:00Z")
	if c := h.counts(); c != [3]int{0, 1, 1} {
		t.Errorf("after the replay without a record: %v", c)
	}
	if h.record(unrecorded) != nil {
		t.Error("the refused replay was recorded")
	}
}

// Records older than the retention are deleted by the listener; younger ones are kept.
func TestRecordRetention(t *testing.T) {
	h := newHarness(t, nil, func(o *webhook.Options) {
		o.DeliveryRetention = time.Hour
		o.RecordGCInterval = 50 * time.Millisecond
	})
	body := fixture(t, "pull_request-opened.json")
	h.mustDeliver("pull_request", deliveryA, "pull_request-opened.json", http.StatusOK)
	// A record received two hours ago, created after the fresh one: a collection that sees it
	// sees the fresh one too.
	old := &scmv1alpha1.Delivery{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: "sha256-" + strings.Repeat("0", 64)},
		Spec: scmv1alpha1.DeliverySpec{DeliveryID: deliveryB, Event: "push",
			ReceivedAt: metav1.NewTime(time.Now().Add(-2 * time.Hour))},
	}
	if err := h.env.Client.Create(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	wait.Eventually(t, 30*time.Second, "the expired record deleted", func(ctx context.Context) (bool, error) {
		err := h.env.Client.Get(ctx, client.ObjectKeyFromObject(old), &scmv1alpha1.Delivery{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if h.record(body) == nil {
		t.Error("the record within the retention was deleted")
	}
	if v, _ := metrics.Gather(t, h.l.Registry()).Sample("crdipc_webhook_delivery_records_expired_total", nil); v != 1 {
		t.Errorf("expired records counted %v, want 1", v)
	}
}

func TestLimitBounds(t *testing.T) {
	cfg := testenv.Get(t).Config
	for name, o := range map[string]webhook.Options{
		"negative concurrent requests": {MaxConcurrentRequests: -1},
		"negative connections":         {MaxConnections: -1},
		"negative retention":           {DeliveryRetention: -time.Hour},
		"negative collection interval": {RecordGCInterval: -time.Minute},
	} {
		o.Config, o.Namespace, o.Secret = cfg, "default", []byte("x")
		if _, err := webhook.New(o); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}
