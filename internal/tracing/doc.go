// Package tracing builds the OpenTelemetry tracer providers of a crdipc
// process: one per service, all feeding the same span processors, so that a
// request followed from a sender through kube-apiserver to its receivers is
// one trace wherever it is looked at.
//
// Spans go to up to two places, both optional:
//
//   - OTLP export, configured as every OpenTelemetry SDK is, by the standard
//     OTEL_EXPORTER_OTLP_* and OTEL_EXPORTER_OTLP_TRACES_* variables (read by
//     the official exporters themselves), or by an endpoint given in Options
//     (a flag). OTEL_TRACES_SAMPLER chooses the sampler.
//   - A Store: the last N traces in memory, for `crdipc up`'s console and
//     `crdipc call --trace`, with no tracing backend to run.
//
// With neither, New returns a Provider whose tracer providers are no-ops, and
// RESTConfig leaves the client unwrapped: tracing that is off costs a span
// context lookup per call, not a span.
//
// The trace crosses processes in two carriers. Over HTTP, the W3C traceparent
// header, which RESTConfig's transport writes on every request made inside a
// trace; kube-apiserver continues it (for every client: see APIServer).
// Through the API,
// the annotation ipc.TraceParentAnnotation on the request object, which
// package ipc writes and reads.
package tracing
