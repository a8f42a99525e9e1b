package ipc

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Receiver metrics, served on the manager's /metrics next to
// controller-runtime's own (reconcile counts, workqueue depth, latencies).
var (
	requestsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "crdipc_requests_total",
		Help: "Requests finished by a receiver, by kind and result (succeeded, failed). Counted once per generation when it finishes.",
	}, []string{"kind", "result"})
	requestErrorsTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "crdipc_request_errors_total",
		Help: "Handler errors that will be retried with backoff, by kind.",
	}, []string{"kind"})
	requestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "crdipc_request_duration_seconds",
		Help:    "Time from a request's creation until it became Ready, by kind (first generation only).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 20), // 1 ms … ~9 min
	}, []string{"kind"})
	requestsInFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "crdipc_requests_in_flight",
		Help: "Requests this receiver has seen whose current generation is not finished, by kind.",
	}, []string{"kind"})
)

func init() {
	metrics.Registry.MustRegister(requestsTotal, requestErrorsTotal, requestDuration, requestsInFlight)
}
