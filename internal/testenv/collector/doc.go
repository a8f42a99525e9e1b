// Package collector runs the OpenTelemetry Collector's own OTLP receiver
// (go.opentelemetry.io/collector/receiver/otlpreceiver) inside a test, on
// loopback, over gRPC and HTTP, and keeps every span it receives: the
// tracing tests check crdipc's export against a receiver crdipc does not
// implement.
package collector
