package ipc

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
)

// benchmarkRequestSpans is the tracing work of one request, sender and receiver: the
// spans and the carrier, without the API calls.
func benchmarkRequestSpans(b *testing.B, tp trace.TracerProvider) {
	tracer := tp.Tracer(tracerName)
	var q queueWait
	queue := q.predicate()
	for b.Loop() {
		obj := &libraryv1alpha1.Book{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "dune", Generation: 1}}
		ctx, call := tracer.Start(context.Background(), "call "+kindOf(obj), trace.WithSpanKind(trace.SpanKindClient))
		InjectTraceContext(ctx, obj)
		queue.Create(event.CreateEvent{Object: obj})
		since := q.take(client.ObjectKeyFromObject(obj))
		rctx, rec := startSpan(context.Background(), tracer, "reconcile Book", []client.Object{obj}, trace.WithTimestamp(since))
		_, wait := tracer.Start(rctx, "queue wait", trace.WithTimestamp(since))
		wait.End()
		_, handle := tracer.Start(rctx, "handle Book")
		EndSpan(handle, nil)
		_, status := tracer.Start(rctx, "write status")
		EndSpan(status, nil)
		EndSpan(rec, nil)
		EndSpan(call, nil)
	}
}

// BenchmarkRequestWithoutTracing is the loop of benchmarkRequestSpans without its tracing
// work (the request object it makes): subtracted from BenchmarkRequestSpansOff, what the
// tracing code costs a request when tracing is off.
func BenchmarkRequestWithoutTracing(b *testing.B) {
	var sink *libraryv1alpha1.Book
	for b.Loop() {
		sink = &libraryv1alpha1.Book{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "dune", Generation: 1}}
	}
	_ = sink
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
