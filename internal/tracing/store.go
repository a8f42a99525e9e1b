package tracing

import (
	"container/list"
	"context"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Span is an ended span as a Store keeps it: what a timeline needs.
type Span struct {
	TraceID trace.TraceID `json:"traceID"`
	SpanID  trace.SpanID  `json:"spanID"`
	// Parent is the span this one is a child of; invalid (all zero) for a
	// trace's root. The parent may belong to another process, or to spans
	// not (yet) stored.
	Parent  trace.SpanID   `json:"parentSpanID"`
	Service string         `json:"service"`
	Name    string         `json:"name"`
	Kind    trace.SpanKind `json:"kind"`
	Start   time.Time      `json:"start"`
	End     time.Time      `json:"end"`
	// Links are the spans this one follows from without being their child,
	// in this trace or another (a reconcile that serves several requests).
	Links []trace.SpanContext `json:"links,omitempty"`
	// Attributes, their values in their string form.
	Attributes map[string]string `json:"attributes,omitempty"`
	// Error is the span's status description when its status is Error.
	Error  string `json:"error,omitempty"`
	Failed bool   `json:"failed,omitempty"`
}

// Duration is how long the span took.
func (s Span) Duration() time.Duration { return s.End.Sub(s.Start) }

// DefaultMaxSpansPerTrace bounds one trace in a Store; spans past it are
// counted, not kept.
const DefaultMaxSpansPerTrace = 1000

// Store is a span processor that keeps the spans of the most recently
// active traces in memory, at most a fixed number of traces, each of at most
// a fixed number of spans: when a span of a new trace ends and the store is
// full, the trace that went longest without a span ending is forgotten.
// Register it with New (Options.Store); it is safe for concurrent use.
type Store struct {
	maxTraces, maxSpans int

	mu     sync.Mutex
	traces map[trace.TraceID]*list.Element // of *storedTrace
	lru    *list.List                      // front: most recently ended span
}

type storedTrace struct {
	id      trace.TraceID
	spans   []Span
	dropped int
}

// NewStore keeps up to maxTraces traces (at least one) of up to
// maxSpansPerTrace spans each (DefaultMaxSpansPerTrace when not positive).
func NewStore(maxTraces, maxSpansPerTrace int) *Store {
	if maxSpansPerTrace <= 0 {
		maxSpansPerTrace = DefaultMaxSpansPerTrace
	}
	return &Store{
		maxTraces: max(maxTraces, 1),
		maxSpans:  maxSpansPerTrace,
		traces:    map[trace.TraceID]*list.Element{},
		lru:       list.New(),
	}
}

// Trace returns the spans of trace id that the store holds, by start time,
// and how many it dropped for the bound on spans per trace; nil if it holds
// none.
func (s *Store) Trace(id trace.TraceID) (spans []Span, dropped int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.traces[id]
	if !ok {
		return nil, 0
	}
	t := e.Value.(*storedTrace)
	spans = slices.Clone(t.spans)
	slices.SortStableFunc(spans, func(a, b Span) int { return a.Start.Compare(b.Start) })
	return spans, t.dropped
}

// Recent returns the IDs of the traces the store holds, the most recently
// active first.
func (s *Store) Recent() []trace.TraceID {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]trace.TraceID, 0, s.lru.Len())
	for e := s.lru.Front(); e != nil; e = e.Next() {
		ids = append(ids, e.Value.(*storedTrace).id)
	}
	return ids
}

// OnStart implements sdktrace.SpanProcessor: a span is kept once it ends.
func (s *Store) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd implements sdktrace.SpanProcessor.
func (s *Store) OnEnd(ro sdktrace.ReadOnlySpan) {
	if !ro.SpanContext().IsSampled() {
		return
	}
	s.add(toSpan(ro))
}

// add keeps span, forgetting the least recently active trace when a new one
// does not fit.
func (s *Store) add(span Span) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.traces[span.TraceID]
	if ok {
		s.lru.MoveToFront(e)
	} else {
		e = s.lru.PushFront(&storedTrace{id: span.TraceID})
		s.traces[span.TraceID] = e
		for s.lru.Len() > s.maxTraces {
			oldest := s.lru.Back()
			s.lru.Remove(oldest)
			delete(s.traces, oldest.Value.(*storedTrace).id)
		}
	}
	t := e.Value.(*storedTrace)
	if len(t.spans) >= s.maxSpans {
		t.dropped++
		return
	}
	t.spans = append(t.spans, span)
}

// Shutdown implements sdktrace.SpanProcessor; the stored traces stay readable.
func (s *Store) Shutdown(context.Context) error { return nil }

// ForceFlush implements sdktrace.SpanProcessor; spans are stored as they end.
func (s *Store) ForceFlush(context.Context) error { return nil }

func toSpan(ro sdktrace.ReadOnlySpan) Span {
	sc := ro.SpanContext()
	span := Span{
		TraceID: sc.TraceID(),
		SpanID:  sc.SpanID(),
		Parent:  ro.Parent().SpanID(),
		Name:    ro.Name(),
		Kind:    ro.SpanKind(),
		Start:   ro.StartTime(),
		End:     ro.EndTime(),
	}
	if res := ro.Resource(); res != nil {
		if v, ok := res.Set().Value(semconv.ServiceNameKey); ok {
			span.Service = v.Emit()
		}
	}
	for _, l := range ro.Links() {
		span.Links = append(span.Links, l.SpanContext)
	}
	if attrs := ro.Attributes(); len(attrs) > 0 {
		span.Attributes = make(map[string]string, len(attrs))
		for _, kv := range attrs {
			span.Attributes[string(kv.Key)] = kv.Value.Emit()
		}
	}
	if st := ro.Status(); st.Code == codes.Error {
		span.Failed, span.Error = true, st.Description
	}
	return span
}
