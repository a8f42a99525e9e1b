package ipc

import (
	"context"
	"maps"
	"reflect"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
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

func isTraceAnnotation(key string) bool {
	return key == TraceParentAnnotation || key == TraceStateAnnotation
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

// TraceContextAnnotations returns the trace context annotations stored on obj
// (TraceParentAnnotation, TraceStateAnnotation), nil when it has none. A
// receiver that keeps an object in shape on every reconcile (server-side
// apply) copies them from its request onto that object, rather than
// injecting its own span: the value then changes only with the request's
// trace, and rewriting it does not wake the receiver again.
func TraceContextAnnotations(obj metav1.Object) map[string]string {
	var out map[string]string
	for _, a := range traceAnnotations {
		if v, ok := obj.GetAnnotations()[a]; ok {
			if out == nil {
				out = map[string]string{}
			}
			out[a] = v
		}
	}
	return out
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
	return startSpan(ctx, tp.Tracer(tracerName), name, objs)
}

func startSpan(ctx context.Context, tracer trace.Tracer, name string, objs []client.Object, extra ...trace.SpanStartOption) (context.Context, trace.Span) {
	opts := append([]trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}, extra...)
	if len(objs) == 1 {
		ctx, span := tracer.Start(ExtractTraceContext(ctx, objs[0]), name, opts...)
		if span.IsRecording() {
			// Named once the span is known to be kept: tracing that is off pays nothing for it.
			span.SetAttributes(requestAttributes(objs[0])...)
		}
		return ctx, span
	}
	for _, obj := range objs {
		if sc := trace.SpanContextFromContext(ExtractTraceContext(context.Background(), obj)); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc, Attributes: requestAttributes(obj)}))
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

// EndSpan ends span, marking it failed with err when err is not nil.
func EndSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// queueWait remembers when a watch event queued each request, for the span of
// the time it waited for a worker (see receiver.reconcile). The workqueue
// holds a key once however many events arrive for it, so the first event's
// time is when the wait began. Requeues (after errors, RequeueAfter) and
// events of watched kinds are not remembered: their reconciles have no
// queue wait span.
type queueWait struct{ m sync.Map } // types.NamespacedName → time.Time

// predicate remembers the time of every event it is shown; it goes after the
// predicates that filter, so that it sees only the events that queue.
func (q *queueWait) predicate() predicate.Predicate {
	mark := func(o client.Object) bool {
		q.m.LoadOrStore(client.ObjectKeyFromObject(o), time.Now())
		return true
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return mark(e.Object) },
		UpdateFunc:  func(e event.UpdateEvent) bool { return mark(e.ObjectNew) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return mark(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return mark(e.Object) },
	}
}

// take returns when key was queued and forgets it; zero when no event queued it.
func (q *queueWait) take(key types.NamespacedName) time.Time {
	if v, ok := q.m.LoadAndDelete(key); ok {
		return v.(time.Time)
	}
	return time.Time{}
}
