package ipc_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/crdipc/crdipc/ipc"
)

func recordingProvider(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, rec
}

func TestTraceContextRoundTripsThroughAnnotations(t *testing.T) {
	tp, _ := recordingProvider(t)
	ctx, span := tp.Tracer("test").Start(context.Background(), "send")
	defer span.End()
	b := newBook("ns", "dune")
	b.Annotations = map[string]string{"keep": "me", ipc.TraceStateAnnotation: "stale=1"}
	ipc.InjectTraceContext(ctx, b)
	if b.Annotations["keep"] != "me" {
		t.Errorf("annotations not kept: %v", b.Annotations)
	}
	if _, ok := b.Annotations[ipc.TraceStateAnnotation]; ok {
		t.Errorf("tracestate of an older trace kept: %v", b.Annotations)
	}
	got := trace.SpanContextFromContext(ipc.ExtractTraceContext(context.Background(), b))
	if !got.IsRemote() || got.TraceID() != span.SpanContext().TraceID() || got.SpanID() != span.SpanContext().SpanID() || !got.IsSampled() {
		t.Errorf("extracted %v, want the remote form of %v", got, span.SpanContext())
	}
}

func TestInjectWithoutSpanLeavesObjectAlone(t *testing.T) {
	b := newBook("ns", "dune")
	ipc.InjectTraceContext(context.Background(), b)
	if b.Annotations != nil {
		t.Errorf("annotations written without a span: %v", b.Annotations)
	}
	if ctx := ipc.ExtractTraceContext(context.Background(), b); trace.SpanContextFromContext(ctx).IsValid() {
		t.Error("span context extracted from an object without one")
	}
}

func TestStartSpanContinuesOneRequestAndLinksSeveral(t *testing.T) {
	tp, rec := recordingProvider(t)
	var senders []trace.SpanContext
	var requests []*book
	for _, name := range []string{"dune", "emma"} {
		ctx, span := tp.Tracer("test").Start(context.Background(), "call "+name)
		b := newBook("ns", name)
		ipc.InjectTraceContext(ctx, b)
		span.End()
		senders, requests = append(senders, span.SpanContext()), append(requests, b)
	}

	_, one := ipc.StartSpan(context.Background(), tp, "reconcile Book", requests[0])
	one.End()
	_, several := ipc.StartSpan(context.Background(), tp, "reconcile Books", requests[0], requests[1])
	several.End()

	ended := rec.Ended()
	child, batch := ended[len(ended)-2], ended[len(ended)-1]
	if child.Parent().SpanID() != senders[0].SpanID() || child.SpanContext().TraceID() != senders[0].TraceID() {
		t.Errorf("reconcile of one request: parent %v, want the sender's span %v", child.Parent(), senders[0])
	}
	if batch.Parent().IsValid() || len(batch.Links()) != 2 {
		t.Fatalf("reconcile of two requests: parent %v, %d links; want a root with 2 links", batch.Parent(), len(batch.Links()))
	}
	for i, l := range batch.Links() {
		if l.SpanContext.SpanID() != senders[i].SpanID() {
			t.Errorf("link %d to %v, want %v", i, l.SpanContext, senders[i])
		}
	}
}
