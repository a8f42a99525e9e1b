package tracing

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func recorder(t *testing.T) (*tracetest.SpanRecorder, trace.TracerProvider) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return rec, tp
}

// remote is ctx carrying a sampled span context from another process, as a server's
// propagator extracts it from a request.
func remote(t *testing.T, tp trace.TracerProvider) (context.Context, trace.SpanContext) {
	_, caller := tp.Tracer("caller").Start(context.Background(), "caller")
	caller.End()
	sc := caller.SpanContext().WithRemote(true)
	return trace.ContextWithRemoteSpanContext(context.Background(), sc), sc
}

// kube-apiserver starts the span of a request from a client outside system:masters as a new
// root linked to the caller's span (otelhttp's public endpoint); adoptCaller makes it the
// caller's child and keeps the span's other options.
func TestAdoptCallerMakesAPublicEndpointSpanAChild(t *testing.T) {
	rec, tp := recorder(t)
	ctx, caller := remote(t, tp)
	other := trace.SpanContextConfig{TraceID: trace.TraceID{9}, SpanID: trace.SpanID{9}, TraceFlags: trace.FlagsSampled}
	_, s := adoptCaller{tp}.Tracer("kube-apiserver").Start(ctx, "POST /books",
		trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithLinks(trace.Link{SpanContext: caller}, trace.Link{SpanContext: trace.NewSpanContext(other)}))
	s.End()

	got := rec.Ended()[len(rec.Ended())-1]
	if !got.Parent().Equal(caller) || got.SpanContext().TraceID() != caller.TraceID() {
		t.Fatalf("span parent %v in trace %s, want the caller %v", got.Parent(), got.SpanContext().TraceID(), caller)
	}
	if got.SpanKind() != trace.SpanKindServer {
		t.Errorf("kind %s, want server", got.SpanKind())
	}
	if links := got.Links(); len(links) != 1 || links[0].SpanContext.TraceID() != other.TraceID {
		t.Errorf("links %v: want only the other link, not the adopted caller's", links)
	}
}

// A new root asked for without the caller's link (no caller, or another reason) stays one.
func TestAdoptCallerLeavesOtherRootsAlone(t *testing.T) {
	rec, tp := recorder(t)
	ctx, caller := remote(t, tp)
	_, s := adoptCaller{tp}.Tracer("kube-apiserver").Start(ctx, "GET /healthz", trace.WithNewRoot())
	s.End()
	got := rec.Ended()[len(rec.Ended())-1]
	if got.Parent().IsValid() || got.SpanContext().TraceID() == caller.TraceID() {
		t.Fatalf("span parent %v in trace %s: want a new root", got.Parent(), got.SpanContext().TraceID())
	}
}

// ChildOnly records the spans of calls made in a trace, and none of the others.
func TestChildOnly(t *testing.T) {
	rec, tp := recorder(t)
	tracer := ChildOnly(tp).Tracer("grpc")
	before := len(rec.Ended())

	ctx, s := tracer.Start(context.Background(), "Probe")
	if s.IsRecording() || trace.SpanContextFromContext(ctx).IsValid() {
		t.Fatal("a call outside a trace started a span")
	}
	s.End()

	parent, caller := remote(t, tp)
	_, s = tracer.Start(parent, "CreateVolume")
	s.End()
	ended := rec.Ended()[before:]
	if len(ended) != 2 || ended[1].Name() != "CreateVolume" || !ended[1].Parent().Equal(caller) {
		t.Fatalf("ended %d spans (the caller's and ...): want CreateVolume as the caller's child", len(ended))
	}
}
