package webhook

import (
	"fmt"

	"github.com/google/go-github/v84/github"
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	deliveries *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	inFlight   prometheus.Gauge
	expired    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "crdipc_webhook_deliveries_total",
			Help: "GitHub webhook deliveries by X-GitHub-Event and result (created, updated, unchanged, stale, duplicate, ignored, pong, or the refusal: overloaded, conflict, ...).",
		}, []string{"event", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "crdipc_webhook_request_duration_seconds",
			Help:    "Time from receiving a webhook request to answering it, by result.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"result"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "crdipc_webhook_requests_in_flight",
			Help: "Deliveries being read, verified or stored now; at the limit (--max-concurrent-requests) more are answered 503.",
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "crdipc_webhook_delivery_records_expired_total",
			Help: "Delivery records this listener deleted because they were older than the retention.",
		}),
	}
	for _, c := range []prometheus.Collector{m.deliveries, m.duration, m.inFlight, m.expired} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering webhook metrics: %w", err)
		}
	}
	return m, nil
}

// knownEvents bounds the event label: a header value GitHub never sends is counted as
// "unknown" instead of creating a series per value a client makes up.
var knownEvents = func() map[string]bool {
	m := map[string]bool{}
	for _, t := range github.MessageTypes() {
		m[t] = true
	}
	return m
}()

func eventLabel(e string) string {
	if knownEvents[e] {
		return e
	}
	if e == "" {
		return "none"
	}
	return "unknown"
}
