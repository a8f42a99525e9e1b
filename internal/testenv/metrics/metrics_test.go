package metrics_test

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/crdipc/crdipc/internal/testenv/metrics"
)

func registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "requests_total"}, []string{"kind", "result"})
	requests.WithLabelValues("Book", "succeeded").Add(2)
	requests.WithLabelValues("Book", "failed").Add(1)
	requests.WithLabelValues("PullRequest", "succeeded").Add(4)
	inFlight := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "in_flight"}, []string{"kind"})
	inFlight.WithLabelValues("Book").Set(0)
	seconds := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "seconds", Buckets: []float64{0.5, 1}}, []string{"kind"})
	seconds.WithLabelValues("Book").Observe(0.25)
	seconds.WithLabelValues("Book").Observe(0.75)
	seconds.WithLabelValues("Book").Observe(2)
	latency := prometheus.NewSummary(prometheus.SummaryOpts{Name: "latency", Objectives: map[float64]float64{0.5: 0.05}})
	latency.Observe(3)
	reg.MustRegister(requests, inFlight, seconds, latency)
	return reg
}

// A scrape and a gather of the same registry read the same.
func TestScrapeAndGather(t *testing.T) {
	reg := registry()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	for name, mfs := range map[string]metrics.Families{
		"scrape": metrics.Scrape(t, srv.URL),
		"gather": metrics.Gather(t, reg),
	} {
		for _, tc := range []struct {
			name   string
			labels map[string]string
			want   float64
			ok     bool
		}{
			{"requests_total", map[string]string{"kind": "Book", "result": "succeeded"}, 2, true},
			{"requests_total", map[string]string{"kind": "Book"}, 0, false}, // not all its labels
			{"in_flight", map[string]string{"kind": "Book"}, 0, true},
			{"in_flight", map[string]string{"kind": "Branch"}, 0, false},
			{"seconds_count", map[string]string{"kind": "Book"}, 3, true},
			{"seconds_sum", map[string]string{"kind": "Book"}, 3, true},
			{"seconds_bucket", map[string]string{"kind": "Book", "le": "0.5"}, 1, true},
			{"seconds_bucket", map[string]string{"kind": "Book", "le": "+Inf"}, 3, true},
			{"latency", map[string]string{"quantile": "0.5"}, 3, true},
			{"latency_count", nil, 1, true},
			{"missing", nil, 0, false},
		} {
			if got, ok := mfs.Sample(tc.name, tc.labels); got != tc.want || ok != tc.ok {
				t.Errorf("%s: Sample(%s, %v) = %v, %v; want %v, %v", name, tc.name, tc.labels, got, ok, tc.want, tc.ok)
			}
		}
		for _, tc := range []struct {
			name   string
			labels map[string]string
			want   float64
		}{
			{"requests_total", nil, 7},
			{"requests_total", map[string]string{"kind": "Book"}, 3},
			{"requests_total", map[string]string{"result": "succeeded"}, 6},
			{"requests_total", map[string]string{"kind": "Book", "absent": ""}, 3},
			{"seconds_count", nil, 3},
			{"missing", nil, 0},
		} {
			if got := mfs.Sum(tc.name, tc.labels); got != tc.want {
				t.Errorf("%s: Sum(%s, %v) = %v, want %v", name, tc.name, tc.labels, got, tc.want)
			}
		}
		if got := mfs.Format("seconds_bucket"); !strings.Contains(got, `seconds_bucket{kind="Book",le="0.5"} 1`) {
			t.Errorf("%s: Format(seconds_bucket) = %q", name, got)
		}
	}
}
