package tracing_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/crdipc/crdipc/internal/tracing"
)

func newProvider(t *testing.T, store *tracing.Store) *tracing.Provider {
	t.Helper()
	p, err := tracing.New(context.Background(), tracing.Options{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return p
}

// trace starts a root span and n children and ends them all.
func startTrace(tr trace.Tracer, n int) trace.TraceID {
	ctx, root := tr.Start(context.Background(), "root")
	for range n {
		_, child := tr.Start(ctx, "child")
		child.End()
	}
	root.End()
	return root.SpanContext().TraceID()
}

func TestStoreKeepsTheMostRecentTraces(t *testing.T) {
	store := tracing.NewStore(3, 0)
	tr := newProvider(t, store).Service("test").Tracer("test")
	var ids []trace.TraceID
	for range 5 {
		ids = append(ids, startTrace(tr, 1))
	}
	recent := store.Recent()
	want := []trace.TraceID{ids[4], ids[3], ids[2]}
	if len(recent) != len(want) {
		t.Fatalf("store holds %d traces, want %d", len(recent), len(want))
	}
	for i := range want {
		if recent[i] != want[i] {
			t.Errorf("recent[%d] = %s, want %s", i, recent[i], want[i])
		}
	}
	for _, id := range ids[:2] {
		if spans, _ := store.Trace(id); spans != nil {
			t.Errorf("trace %s kept after it was the least recent of a full store: %d spans", id, len(spans))
		}
	}
	if spans, dropped := store.Trace(ids[4]); len(spans) != 2 || dropped != 0 {
		t.Errorf("newest trace: %d spans, %d dropped; want 2, 0", len(spans), dropped)
	}
}

func TestStoreEvictsTheLeastRecentlyActiveTrace(t *testing.T) {
	store := tracing.NewStore(2, 0)
	tr := newProvider(t, store).Service("test").Tracer("test")
	// A long trace: its root ends after newer traces began.
	ctx, long := tr.Start(context.Background(), "long")
	_, first := tr.Start(ctx, "first")
	first.End()
	newer := startTrace(tr, 0)
	long.End() // the long trace is now the most recently active
	newest := startTrace(tr, 0)
	if spans, _ := store.Trace(long.SpanContext().TraceID()); len(spans) != 2 {
		t.Errorf("long trace holds %d spans, want 2: it was active more recently than %s", len(spans), newer)
	}
	if spans, _ := store.Trace(newer); spans != nil {
		t.Errorf("trace %s kept, want it evicted as the least recently active", newer)
	}
	if spans, _ := store.Trace(newest); len(spans) != 1 {
		t.Errorf("newest trace holds %d spans, want 1", len(spans))
	}
}

func TestStoreBoundsSpansPerTrace(t *testing.T) {
	store := tracing.NewStore(1, 4)
	tr := newProvider(t, store).Service("test").Tracer("test")
	id := startTrace(tr, 9)
	spans, dropped := store.Trace(id)
	if len(spans) != 4 || dropped != 6 {
		t.Fatalf("%d spans kept, %d dropped; want 4, 6", len(spans), dropped)
	}
}

func TestStoreRecordsWhatATimelineShows(t *testing.T) {
	store := tracing.NewStore(1, 0)
	tr := newProvider(t, store).Service("books").Tracer("test")
	ctx, root := tr.Start(context.Background(), "call Book", trace.WithSpanKind(trace.SpanKindClient))
	link := trace.LinkFromContext(ctx)
	_, child := tr.Start(ctx, "reconcile Book", trace.WithLinks(link), trace.WithAttributes(attribute.String("ipc.name", "dune")))
	child.SetStatus(codes.Error, "no such author")
	child.End()
	root.End()

	spans, _ := store.Trace(root.SpanContext().TraceID())
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	r, c := spans[0], spans[1]
	if r.Name != "call Book" || r.Service != "books" || r.Kind != trace.SpanKindClient || r.Parent.IsValid() {
		t.Errorf("root span = %+v", r)
	}
	if c.Parent != r.SpanID || c.Attributes["ipc.name"] != "dune" || !c.Failed || c.Error != "no such author" {
		t.Errorf("child span = %+v", c)
	}
	if len(c.Links) != 1 || c.Links[0].SpanID() != r.SpanID {
		t.Errorf("child links = %v, want the root", c.Links)
	}
	if c.Duration() < 0 || c.End.Before(c.Start) {
		t.Errorf("child ends before it starts: %v – %v", c.Start, c.End)
	}
}

func TestOffIsNoop(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	p := newProvider(t, nil)
	if p.Enabled() {
		t.Fatal("provider with no export and no store is enabled")
	}
	_, span := p.Service("test").Tracer("test").Start(context.Background(), "x")
	if span.IsRecording() || span.SpanContext().IsValid() {
		t.Errorf("span of a provider that is off records or has a trace: %v", span.SpanContext())
	}
}

// OTEL_SDK_DISABLED=true turns tracing off altogether, the store included: up's console
// then says tracing is off.
func TestSDKDisabledTurnsEverythingOff(t *testing.T) {
	t.Setenv("OTEL_SDK_DISABLED", "true")
	store := tracing.NewStore(10, 0)
	p, err := tracing.New(context.Background(), tracing.Options{Store: store, Receivers: []string{"http://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	if p.Enabled() {
		t.Fatal("provider enabled with OTEL_SDK_DISABLED=true")
	}
	_, span := p.Service("books").Tracer("test").Start(context.Background(), "reconcile Book")
	span.End()
	if span.SpanContext().IsValid() || len(store.Recent()) != 0 {
		t.Fatalf("a span was recorded (%v), store holds %v", span.SpanContext(), store.Recent())
	}
}
