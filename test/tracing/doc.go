// Package tracing tests that a request is one trace across the processes it
// crosses: the sender, kube-apiserver and the receivers, each exporting its
// spans over OTLP to a receiver crdipc does not implement, the OpenTelemetry
// Collector's own (go.opentelemetry.io/collector/receiver/otlpreceiver),
// started in process on loopback (internal/testenv/collector).
package tracing
