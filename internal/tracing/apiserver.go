package tracing

import (
	"context"

	"go.opentelemetry.io/otel/trace"
)

// adoptCaller is kube-apiserver's tracer provider in a cluster whose every client holds an
// identity the same owner minted (crdipc up, its tests): it makes a request's span a child
// of the caller's span, which kube-apiserver otherwise does only for system:masters and
// system:monitoring clients. For anyone else kube-apiserver's handler chain starts the
// span as a new root linked to the caller's (otelhttp's public endpoint), so that an
// untrusted client cannot put its spans into, or force sampling of, someone else's trace.
// Here every client is one of the services of the same process, whose writes belong in
// the request's trace: a controller's status write, a receiver's child object.
type adoptCaller struct{ trace.TracerProvider }

func (p adoptCaller) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return adoptingTracer{p.TracerProvider.Tracer(name, opts...)}
}

type adoptingTracer struct{ trace.Tracer }

// Start starts the span as the caller's child when it was to be a new root linked to the
// remote span context that ctx carries (the caller's); any other span as asked.
func (t adoptingTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	cfg := trace.NewSpanStartConfig(opts...)
	caller := trace.SpanContextFromContext(ctx)
	if !cfg.NewRoot() || !caller.IsValid() || !caller.IsRemote() {
		return t.Tracer.Start(ctx, name, opts...)
	}
	var links []trace.Link
	adopted := false
	for _, l := range cfg.Links() {
		if !adopted && l.SpanContext.Equal(caller) {
			adopted = true
			continue
		}
		links = append(links, l)
	}
	if !adopted {
		return t.Tracer.Start(ctx, name, opts...)
	}
	child := []trace.SpanStartOption{
		trace.WithAttributes(cfg.Attributes()...),
		trace.WithLinks(links...),
		trace.WithSpanKind(cfg.SpanKind()),
	}
	if ts := cfg.Timestamp(); !ts.IsZero() {
		child = append(child, trace.WithTimestamp(ts))
	}
	return t.Tracer.Start(ctx, name, child...)
}
