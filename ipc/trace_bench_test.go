package ipc

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
)

// benchmarkRequestSpans is the tracing work of one request, sender and receiver: the
// spans and the carrier, without the API calls.
func benchmarkRequestSpans(b *testing.B, tp trace.TracerProvider) {
	tracer := tp.Tracer(tracerName)
	for b.Loop() {
		obj := &libraryv1alpha1.Book{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "dune", Generation: 1}}
		ctx, call := tracer.Start(context.Background(), "call "+kindOf(obj), trace.WithSpanKind(trace.SpanKindClient))
		InjectTraceContext(ctx, obj)
		rctx, rec := startSpan(context.Background(), tracer, "reconcile Book", obj)
		_, handle := tracer.Start(rctx, "handle Book")
		endSpan(handle, nil)
		_, status := tracer.Start(rctx, "write status")
		endSpan(status, nil)
		endSpan(rec, nil)
		endSpan(call, nil)
	}
}

// BenchmarkRequestSpansOff is what tracing costs a request when no provider is set: a
// bench roundtrip takes milliseconds per request.
func BenchmarkRequestSpansOff(b *testing.B) {
	benchmarkRequestSpans(b, otel.GetTracerProvider())
}

// BenchmarkRequestSpansOn records every span (to memory, with no export).
func BenchmarkRequestSpansOn(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	benchmarkRequestSpans(b, tp)
}
