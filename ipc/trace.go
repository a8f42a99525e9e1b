package ipc

import (
	"context"
	"maps"
	"reflect"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TraceParentAnnotation holds the W3C traceparent of the trace a request
// belongs to: the span that sent it, for the receiver to continue. It is the
// carrier KEP-5915 proposes, so that other tools following the KEP read it
// too. Call writes it; receivers read it and never change it, so that every
// reconcile of one generation continues the same trace.
const TraceParentAnnotation = "tracing.k8s.io/traceparent"

// TraceStateAnnotation holds the W3C tracestate that goes with
// TraceParentAnnotation, when the trace has one.
const TraceStateAnnotation = "tracing.k8s.io/tracestate"

// tracerName is the instrumentation scope of ipc's spans.
const tracerName = "github.com/crdipc/crdipc/ipc"

var traceContext propagation.TraceContext

// annotationCarrier reads and writes the W3C trace context headers
// (traceparent, tracestate) as annotations.
type annotationCarrier map[string]string

var traceAnnotations = map[string]string{
	"traceparent": TraceParentAnnotation,
	"tracestate":  TraceStateAnnotation,
}

func (c annotationCarrier) Get(key string) string {
	if a, ok := traceAnnotations[key]; ok {
		return c[a]
	}
	return ""
}

func (c annotationCarrier) Set(key, value string) {
	if a, ok := traceAnnotations[key]; ok {
		c[a] = value
	}
}

func (c annotationCarrier) Keys() []string {
	var keys []string
	for k, a := range traceAnnotations {
		if _, ok := c[a]; ok {
			keys = append(keys, k)
		}
	}
	return keys
}

// InjectTraceContext stores the span context of ctx on obj, in
// TraceParentAnnotation (and TraceStateAnnotation), replacing any stored
// before. Call does it for the requests it sends; a receiver does it for the
// objects it creates for a request, with the context its handler is given, so
// that their receivers continue the request's trace. Without a span context
// in ctx, obj is left as it is.
func InjectTraceContext(ctx context.Context, obj metav1.Object) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	annotations := maps.Clone(obj.GetAnnotations())
	if annotations == nil {
		annotations = map[string]string{}
	}
	delete(annotations, TraceStateAnnotation) // the new context may have none
	traceContext.Inject(ctx, annotationCarrier(annotations))
	obj.SetAnnotations(annotations)
}

// ExtractTraceContext returns ctx carrying the span context stored on obj by
// InjectTraceContext, as a remote parent; ctx itself when obj holds none, or
// none that parses.
func ExtractTraceContext(ctx context.Context, obj metav1.Object) context.Context {
	annotations := obj.GetAnnotations()
	if annotations[TraceParentAnnotation] == "" {
		return ctx
	}
	return traceContext.Extract(ctx, annotationCarrier(annotations))
}

// StartSpan starts the span of work for the requests objs, such as a
// reconcile, named name. For one request, the span continues the request's
// trace (a child of the span in its TraceParentAnnotation); for several, it
// is a span of its own that links to each request's span, as KEP-5915 has a
// controller do whose work serves several requests at once. A request
// without the annotation starts a trace (or goes on with the one in ctx).
// tp nil is the global provider (otel.GetTracerProvider). End the span.
func StartSpan(ctx context.Context, tp trace.TracerProvider, name string, objs ...client.Object) (context.Context, trace.Span) {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return startSpan(ctx, tp.Tracer(tracerName), name, objs...)
}

func startSpan(ctx context.Context, tracer trace.Tracer, name string, objs ...client.Object) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	if len(objs) == 1 {
		ctx = ExtractTraceContext(ctx, objs[0])
		opts = append(opts, trace.WithAttributes(requestAttributes(objs[0])...))
	} else {
		for _, obj := range objs {
			if sc := trace.SpanContextFromContext(ExtractTraceContext(context.Background(), obj)); sc.IsValid() {
				opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc, Attributes: requestAttributes(obj)}))
			}
		}
	}
	return tracer.Start(ctx, name, opts...)
}

// requestAttributes name a request on a span.
func requestAttributes(obj client.Object) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("ipc.kind", kindOf(obj)),
		attribute.String("k8s.namespace.name", obj.GetNamespace()),
		attribute.String("ipc.name", obj.GetName()),
		attribute.Int64("ipc.generation", obj.GetGeneration()),
	}
}

// kindOf names obj's kind without a scheme: from its type meta when set
// (unstructured objects), else from its Go type, which crdipc's types name
// after their kind.
func kindOf(obj client.Object) string {
	if k := obj.GetObjectKind().GroupVersionKind().Kind; k != "" {
		return k
	}
	t := reflect.TypeOf(obj)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Name()
}

// endSpan ends span, marking it failed when err is not nil.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
