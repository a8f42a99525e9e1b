package webhook_test

import (
	"net/http"
	"testing"

	"github.com/crdipc/crdipc/internal/scm/delivery"
	"github.com/crdipc/crdipc/internal/testenv/metrics"
)

func TestMetrics(t *testing.T) {
	h := newHarness(t, nil)
	h.mustDeliver("pull_request", deliveryA, "pull_request-opened.json", 200)
	h.mustDeliver("pull_request", deliveryA, "pull_request-opened.json", 200)
	h.mustDeliver("pull_request", deliveryB, "pull_request-synchronize.json", 200)
	h.mustDeliver("push", deliveryC, "push-tag.json", 202)
	h.mustDeliver("issues", deliveryD, "issues-opened.json", 202)
	bad := h.request("pull_request", deliveryE, fixture(t, "pull_request-opened.json"))
	bad.Header.Set("X-Hub-Signature-256", delivery.Sign([]byte("wrong"), []byte("x")))
	h.do(bad)

	mfs := metrics.Scrape(t, h.ops.URL+"/metrics")
	for _, tc := range []struct {
		event, result string
		want          float64
	}{
		{"pull_request", "created", 1}, {"pull_request", "duplicate", 1}, {"pull_request", "updated", 1},
		{"push", "ignored", 1}, {"issues", "ignored", 1}, {"pull_request", "unauthorized", 1},
	} {
		if v, ok := mfs.Sample("crdipc_webhook_deliveries_total", map[string]string{"event": tc.event, "result": tc.result}); !ok || v != tc.want {
			t.Errorf("crdipc_webhook_deliveries_total{event=%q,result=%q} = %v (present %v), want %v", tc.event, tc.result, v, ok, tc.want)
		}
	}
	if n := mfs.Sum("crdipc_webhook_request_duration_seconds_count", nil); n != 6 {
		t.Errorf("request duration histogram counted %v requests, want 6", n)
	}
	if mfs["go_goroutines"] == nil {
		t.Error("no Go runtime metrics")
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if r, err := http.Get(h.ops.URL + path); err != nil || r.StatusCode != 200 {
			t.Errorf("%s: %v %v", path, r, err)
		}
	}
	// The port GitHub reaches serves /webhook and nothing else.
	for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
		if r, err := http.Get(h.srv.URL + path); err != nil || r.StatusCode != http.StatusNotFound {
			t.Errorf("%s on the webhook port: %v %v, want 404", path, r, err)
		}
	}
}
