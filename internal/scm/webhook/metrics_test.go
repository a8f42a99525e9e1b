package webhook_test

import (
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape parses /metrics with Prometheus' own text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	return mfs
}

// sample finds the sample of family name whose labels include want.
func sample(mfs map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	mf := mfs[name]
	if mf == nil {
		return nil
	}
next:
	for _, m := range mf.GetMetric() {
		got := map[string]string{}
		for _, lp := range m.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

func TestMetrics(t *testing.T) {
	h := newHarness(t, nil)
	h.mustDeliver("pull_request", deliveryA, "pull_request-opened.json", 200)
	h.mustDeliver("pull_request", deliveryA, "pull_request-opened.json", 200)
	h.mustDeliver("pull_request", deliveryB, "pull_request-synchronize.json", 200)
	h.mustDeliver("push", deliveryC, "push-tag.json", 202)
	h.mustDeliver("issues", deliveryD, "issues-opened.json", 202)
	bad := h.request("pull_request", deliveryE, fixture(t, "pull_request-opened.json"))
	bad.Header.Set("X-Hub-Signature-256", sign("wrong", []byte("x")))
	h.do(bad)

	mfs := scrape(t, h.srv.URL+"/metrics")
	for _, tc := range []struct {
		event, result string
		want          float64
	}{
		{"pull_request", "created", 1}, {"pull_request", "duplicate", 1}, {"pull_request", "updated", 1},
		{"push", "ignored", 1}, {"issues", "ignored", 1}, {"pull_request", "unauthorized", 1},
	} {
		m := sample(mfs, "crdipc_webhook_deliveries_total", map[string]string{"event": tc.event, "result": tc.result})
		if m == nil || m.GetCounter().GetValue() != tc.want {
			t.Errorf("crdipc_webhook_deliveries_total{event=%q,result=%q} = %v, want %v", tc.event, tc.result, m, tc.want)
		}
	}
	var n uint64
	for _, m := range mfs["crdipc_webhook_request_duration_seconds"].GetMetric() {
		n += m.GetHistogram().GetSampleCount()
	}
	if n != 6 {
		t.Errorf("request duration histogram counted %d requests, want 6", n)
	}
	if mfs["go_goroutines"] == nil {
		t.Error("no Go runtime metrics")
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if r, err := http.Get(h.srv.URL + path); err != nil || r.StatusCode != 200 {
			t.Errorf("%s: %v %v", path, r, err)
		}
	}
}
