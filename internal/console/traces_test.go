package console

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crdipc/crdipc/api/conditions"
	"github.com/crdipc/crdipc/internal/tracing"
	"github.com/crdipc/crdipc/ipc"
)

const (
	traceHex   = "4bf92f3577b34da6a3ce929d0e0e4736"
	traceParam = "00-" + traceHex + "-00f067aa0ba902b7-01"
)

func TestTraceIDOf(t *testing.T) {
	for _, tc := range []struct{ annotation, want string }{
		{traceParam, traceHex},
		{"00-" + traceHex + "-00f067aa0ba902b7-00", traceHex}, // not sampled: still the request's trace
		{"", ""},
		{"00-" + strings.ToUpper(traceHex) + "-00f067aa0ba902b7-01", ""},
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""},
		{"00-" + traceHex + "-0000000000000000-01", ""},
		{"ff-" + traceHex + "-00f067aa0ba902b7-01", ""},
		{"00-" + traceHex[:30] + "-00f067aa0ba902b7-01", ""},
		{"garbage", ""},
	} {
		b := book("a", 1, 0, "", "", t0)
		if tc.annotation != "" {
			b.Annotations = map[string]string{ipc.TraceParentAnnotation: tc.annotation}
		}
		if got := traceIDOf(b); got != tc.want {
			t.Errorf("trace ID of %q = %q, want %q", tc.annotation, got, tc.want)
		}
	}
}

func TestTrackerCarriesTraceIDs(t *testing.T) {
	tr := newTracker()
	pending := book("a", 1, 0, "", "", t0)
	pending.Annotations = map[string]string{ipc.TraceParentAnnotation: traceParam}
	tr.observe("Book", pending, false, t0)
	if r, _ := tr.oldestInFlight(1); len(r) != 1 || r[0].TraceID != traceHex {
		t.Fatalf("in flight = %+v, want trace %s", r, traceHex)
	}
	done := book("a", 1, 1, metav1.ConditionTrue, conditions.ReasonSucceeded, t0)
	done.Annotations = pending.Annotations
	tr.observe("Book", done, false, t0.Add(time.Second))
	tr.observe("Book", book("b", 1, 1, metav1.ConditionTrue, conditions.ReasonSucceeded, t0.Add(2*time.Second)), false, t0.Add(2*time.Second))
	got := tr.recent()
	if len(got) != 2 || got[1].TraceID != traceHex || got[0].TraceID != "" {
		t.Fatalf("completions = %+v, want b without a trace, then a with trace %s", got, traceHex)
	}
}

// recordTrace records, through a real SDK provider into store, a call of two services:
//
//	call · call Book          0–100 ms
//	  call · create Book      5–8 ms
//	  books · reconcile Book  10–90 ms
//	    books · update status 20–30 ms, failed
//	books · watch Book        50–60 ms, its parent a span the store does not hold
func recordTrace(t *testing.T, store *tracing.Store) trace.TraceID {
	t.Helper()
	p, err := tracing.New(context.Background(), tracing.Options{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	call, books := p.Service("call").Tracer("test"), p.Service("books").Tracer("test")
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	span := func(ctx context.Context, tr trace.Tracer, name string, from int, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
		return tr.Start(ctx, name, append(opts, trace.WithTimestamp(at(from)))...)
	}
	ctx, root := span(context.Background(), call, "call Book", 0, trace.WithSpanKind(trace.SpanKindClient))
	_, create := span(ctx, call, "create Book", 5, trace.WithSpanKind(trace.SpanKindClient))
	create.End(trace.WithTimestamp(at(8)))
	rctx, reconcile := span(ctx, books, "reconcile Book", 10, trace.WithAttributes(attribute.String("ipc.name", "dune")))
	_, status := span(rctx, books, "update status", 20)
	status.SetStatus(codes.Error, "conflict")
	status.End(trace.WithTimestamp(at(30)))
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: root.SpanContext().TraceID(), SpanID: trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	_, watch := span(trace.ContextWithRemoteSpanContext(context.Background(), remote), books, "watch Book", 50)
	watch.End(trace.WithTimestamp(at(60)))
	reconcile.End(trace.WithTimestamp(at(90)))
	root.End(trace.WithTimestamp(at(100)))
	return root.SpanContext().TraceID()
}

func get(t *testing.T, c *Console, path string, v any) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if v != nil && rec.Code == http.StatusOK {
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("GET %s: Content-Type %q", path, ct)
		}
		if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
	}
	return rec
}

func TestServeTrace(t *testing.T) {
	store := tracing.NewStore(10, 0)
	id := recordTrace(t, store)
	c := &Console{traces: store}

	var tr Trace
	if rec := get(t, c, "/traces/"+id.String(), &tr); rec.Code != http.StatusOK {
		t.Fatalf("GET /traces/%s: %d %s", id, rec.Code, rec.Body)
	}
	if tr.TraceID != id.String() || tr.DurationMS != 100 || !tr.Start.Equal(t0) || tr.Dropped != 0 {
		t.Errorf("trace %s: %v ms from %v, %d dropped; want %s, 100 ms from %v, none dropped", tr.TraceID, tr.DurationMS, tr.Start, tr.Dropped, id, t0)
	}
	type row struct {
		service, name string
		depth         int
		offset, dur   float64
		root, failed  bool
	}
	var got []row
	for _, s := range tr.Spans {
		got = append(got, row{s.Service, s.Name, s.Depth, s.OffsetMS, s.DurationMS, s.Root, s.Failed})
	}
	want := []row{
		{"call", "call Book", 0, 0, 100, true, false},
		{"call", "create Book", 1, 5, 3, false, false},
		{"books", "reconcile Book", 1, 10, 80, false, false},
		{"books", "update status", 2, 20, 10, false, true},
		{"books", "watch Book", 0, 50, 10, true, false},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("spans by start:\n got %+v\nwant %+v", got, want)
	}
	byName := map[string]TraceSpan{}
	for _, s := range tr.Spans {
		byName[s.Name] = s
	}
	if s := byName["reconcile Book"]; s.ParentSpanID != byName["call Book"].SpanID || s.Attributes["ipc.name"] != "dune" || s.Kind != "internal" {
		t.Errorf("reconcile span = %+v, want child of call Book, ipc.name dune, internal", s)
	}
	if s := byName["update status"]; s.Error != "conflict" {
		t.Errorf("failed span's error = %q, want conflict", s.Error)
	}
	if s := byName["watch Book"]; s.ParentSpanID != "0102030405060708" {
		t.Errorf("orphan's parent = %q, want the span not held", s.ParentSpanID)
	}
	if s := byName["call Book"]; s.ParentSpanID != "" || s.Kind != "client" {
		t.Errorf("root span = %+v, want no parent, client", s)
	}
	// The tree is the waterfall's rows in order.
	var order []string
	var walk func(ns []SpanNode)
	walk = func(ns []SpanNode) {
		for _, n := range ns {
			for _, s := range tr.Spans {
				if s.SpanID == n.SpanID {
					order = append(order, s.Name)
				}
			}
			walk(n.Children)
		}
	}
	walk(tr.Tree)
	if want := []string{"call Book", "create Book", "reconcile Book", "update status", "watch Book"}; !slices.Equal(order, want) {
		t.Errorf("tree order %v, want %v", order, want)
	}

	var list TraceList
	if rec := get(t, c, "/traces", &list); rec.Code != http.StatusOK {
		t.Fatalf("GET /traces: %d %s", rec.Code, rec.Body)
	}
	if len(list.Traces) != 1 {
		t.Fatalf("GET /traces = %+v, want the one trace", list)
	}
	if s := list.Traces[0]; s.TraceID != id.String() || s.Service != "call" || s.Name != "call Book" || s.DurationMS != 100 || s.Spans != 5 || !s.Failed {
		t.Errorf("listed trace = %+v, want %s by its root call · call Book, 100 ms, 5 spans, failed", s, id)
	}

	for _, tc := range []struct {
		path string
		code int
		why  string
	}{
		{"/traces/xyz", http.StatusBadRequest, "length"},
		{"/traces/" + strings.Repeat("g", 32), http.StatusBadRequest, "[0-9a-f]"},
		{"/traces/" + strings.Repeat("0", 32), http.StatusBadRequest, "zero"},
		{"/traces/" + id.String() + "/x", http.StatusBadRequest, "length"},
		{"/traces/" + traceHex, http.StatusNotFound, "not held"},
	} {
		rec := get(t, c, tc.path, nil)
		if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.why) {
			t.Errorf("GET %s: %d %q, want %d saying %q", tc.path, rec.Code, rec.Body, tc.code, tc.why)
		}
	}
	if rec := get(t, c, "/traces/"+strings.ToUpper(id.String()), nil); rec.Code != http.StatusOK {
		t.Errorf("GET of the trace ID in capitals: %d %s", rec.Code, rec.Body)
	}
}

func TestTracesOff(t *testing.T) {
	c := &Console{}
	for _, path := range []string{"/traces", "/traces/" + traceHex} {
		if rec := get(t, c, path, nil); rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "tracing is off") {
			t.Errorf("GET %s with no trace source: %d %q, want 404 saying tracing is off", path, rec.Code, rec.Body)
		}
	}
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/traces", strings.NewReader("")))
	if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "no OTLP receiver") {
		t.Errorf("POST /v1/traces with no receiver: %d %q, want 404 saying there is none", rec.Code, rec.Body)
	}
}

// Another process's exporter, pointed at the console as its OTLP endpoint (what `crdipc
// call --trace` does), adds its spans to the trace the page shows.
func TestConsoleReceivesOTLP(t *testing.T) {
	store := tracing.NewStore(10, 0)
	srv := httptest.NewServer(&Console{traces: store, spans: store.OTLPHandler()})
	t.Cleanup(srv.Close)
	p, err := tracing.New(context.Background(), tracing.Options{Receivers: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.Service("crdipc-call").Tracer("test").Start(context.Background(), "call Book")
	span.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	var tr Trace
	id := span.SpanContext().TraceID()
	if rec := get(t, &Console{traces: store}, "/traces/"+id.String(), &tr); rec.Code != http.StatusOK {
		t.Fatalf("GET /traces/%s: %d %s", id, rec.Code, rec.Body)
	}
	if len(tr.Spans) != 1 || tr.Spans[0].Service != "crdipc-call" || tr.Spans[0].Name != "call Book" {
		t.Fatalf("trace %s = %+v, want the sender's call Book", id, tr.Spans)
	}
}

// Spans that name each other as parent (a process may export anything) are still shown,
// each once.
func TestLayoutSurvivesParentCycles(t *testing.T) {
	a, b := trace.SpanID{1}, trace.SpanID{2}
	spans := []tracing.Span{
		{SpanID: a, Parent: b, Name: "a", Start: t0, End: t0.Add(time.Millisecond)},
		{SpanID: b, Parent: a, Name: "b", Start: t0.Add(time.Millisecond), End: t0.Add(2 * time.Millisecond)},
	}
	tr := layout(trace.TraceID{1}, spans, 0)
	if len(tr.Tree) != 1 || tr.Tree[0].SpanID != a.String() || len(tr.Tree[0].Children) != 1 || tr.Spans[1].Depth != 1 {
		t.Errorf("tree of a cycle = %+v, want a, then b under it", tr.Tree)
	}
}
