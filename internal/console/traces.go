package console

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/crdipc/crdipc/internal/tracing"
)

// TraceSource is where the console reads traces: in up, the *tracing.Store its services'
// spans end in. The console only reads it; the source bounds what it holds.
type TraceSource interface {
	// Trace returns the spans of trace id that the source holds, by start time, and how
	// many it dropped; nil when it holds none.
	Trace(id trace.TraceID) (spans []tracing.Span, dropped int)
	// Recent returns the IDs of the traces the source holds, the most recently active first.
	Recent() []trace.TraceID
}

var _ TraceSource = (*tracing.Store)(nil)

// Bounds on what one answer about traces holds; the source bounds the spans per trace.
const (
	maxTraces         = 50  // listed by GET /traces
	maxSpanAttributes = 8   // per span; the first by key
	maxAttributeValue = 256 // bytes of an attribute value
)

// Trace is GET /traces/<id>: one trace laid out for a waterfall.
type Trace struct {
	TraceID string `json:"traceId"`
	// Start and End span the trace: its earliest start and latest end.
	Start      time.Time `json:"start"`
	End        time.Time `json:"end"`
	DurationMS float64   `json:"durationMs"`
	// Spans are by start time.
	Spans []TraceSpan `json:"spans"`
	// Tree is the spans under their parents, roots and children by start time: the
	// waterfall's rows in order.
	Tree []SpanNode `json:"tree"`
	// Dropped counts the spans the source did not keep (its bound on spans per trace).
	Dropped int `json:"dropped"`
}

// TraceSpan is a span of a Trace.
type TraceSpan struct {
	SpanID string `json:"spanId"`
	// ParentSpanID is empty for a span that started the trace.
	ParentSpanID string `json:"parentSpanId,omitempty"`
	// Root is set when the parent is not in the trace (none, another process's span not
	// recorded here, or one not ended yet): the waterfall shows the span at the top level.
	Root    bool      `json:"root,omitempty"`
	Depth   int       `json:"depth"`
	Service string    `json:"service"`
	Name    string    `json:"name"`
	Kind    string    `json:"kind"`
	Start   time.Time `json:"start"`
	End     time.Time `json:"end"`
	// OffsetMS is when the span started, from the trace's start.
	OffsetMS   float64           `json:"offsetMs"`
	DurationMS float64           `json:"durationMs"`
	Failed     bool              `json:"failed,omitempty"`
	Error      string            `json:"error,omitempty"`
	Attributes map[string]string `json:"attributes,omitempty"`
	Links      []SpanRef         `json:"links,omitempty"`
}

// SpanRef names a span, possibly of another trace: a link.
type SpanRef struct {
	TraceID string `json:"traceId"`
	SpanID  string `json:"spanId"`
}

// SpanNode is a span in Trace.Tree.
type SpanNode struct {
	SpanID   string     `json:"spanId"`
	Children []SpanNode `json:"children,omitempty"`
}

// TraceList is GET /traces: the traces the source holds, the most recently active first.
type TraceList struct {
	Traces []TraceSummary `json:"traces"`
	// Omitted counts the older traces held but not listed.
	Omitted int `json:"omitted,omitempty"`
}

// TraceSummary is a trace by its root span, the earliest span with no parent in the trace.
type TraceSummary struct {
	TraceID    string    `json:"traceId"`
	Service    string    `json:"service"`
	Name       string    `json:"name"`
	Start      time.Time `json:"start"`
	DurationMS float64   `json:"durationMs"` // the root span's
	Spans      int       `json:"spans"`
	Failed     bool      `json:"failed,omitempty"` // some span failed
}

// serveTraces answers GET /traces (TraceList) and GET /traces/<32 hex digits> (Trace).
func (c *Console) serveTraces(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if c.traces == nil {
		http.Error(w, "console: tracing is off: no traces are kept", http.StatusNotFound)
		return
	}
	hex, _ := strings.CutPrefix(r.URL.Path, "/traces")
	hex = strings.TrimPrefix(hex, "/")
	if hex == "" {
		writeJSON(w, listTraces(c.traces))
		return
	}
	// Hex digits are lowercase on the wire; a person may paste them in capitals.
	id, err := trace.TraceIDFromHex(strings.ToLower(hex))
	if err != nil {
		http.Error(w, fmt.Sprintf("console: trace id %q: %v", hex, err), http.StatusBadRequest)
		return
	}
	spans, dropped := c.traces.Trace(id)
	if len(spans) == 0 {
		http.Error(w, fmt.Sprintf("console: trace %s is not held: only the most recent traces are kept", id), http.StatusNotFound)
		return
	}
	writeJSON(w, layout(id, spans, dropped))
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, fmt.Sprintf("console: encoding: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

func listTraces(src TraceSource) TraceList {
	ids := src.Recent()
	l := TraceList{Traces: []TraceSummary{}}
	if len(ids) > maxTraces {
		l.Omitted, ids = len(ids)-maxTraces, ids[:maxTraces]
	}
	for _, id := range ids {
		spans, _ := src.Trace(id)
		if len(spans) == 0 {
			continue // forgotten since Recent
		}
		s := TraceSummary{TraceID: id.String(), Spans: len(spans)}
		in := spanSet(spans)
		root := -1
		for i := range spans {
			s.Failed = s.Failed || spans[i].Failed
			if root < 0 && !in[spans[i].Parent] {
				root = i
			}
		}
		// Every span's parent in the trace is a cycle; its earliest span stands in.
		r := spans[max(root, 0)]
		s.Service, s.Name, s.Start, s.DurationMS = r.Service, r.Name, r.Start, ms(r.Duration())
		l.Traces = append(l.Traces, s)
	}
	return l
}

// spanSet is the IDs of spans.
func spanSet(spans []tracing.Span) map[trace.SpanID]bool {
	in := make(map[trace.SpanID]bool, len(spans))
	for i := range spans {
		in[spans[i].SpanID] = true
	}
	return in
}

// layout turns spans, by start time, into a Trace: each span under its parent.
func layout(id trace.TraceID, spans []tracing.Span, dropped int) Trace {
	t := Trace{TraceID: id.String(), Dropped: dropped, Spans: make([]TraceSpan, len(spans)), Tree: []SpanNode{}}
	t.Start, t.End = spans[0].Start, spans[0].End
	for i := range spans {
		if spans[i].Start.Before(t.Start) {
			t.Start = spans[i].Start
		}
		if spans[i].End.After(t.End) {
			t.End = spans[i].End
		}
	}
	t.DurationMS = ms(t.End.Sub(t.Start))
	in := spanSet(spans)
	children := map[trace.SpanID][]int{}
	for i := range spans {
		s := &spans[i]
		out := TraceSpan{
			SpanID: s.SpanID.String(), Service: s.Service, Name: s.Name, Kind: s.Kind.String(),
			Start: s.Start, End: s.End, OffsetMS: ms(s.Start.Sub(t.Start)), DurationMS: ms(s.Duration()),
			Failed: s.Failed, Error: s.Error, Attributes: someAttributes(s.Attributes),
			Root: !in[s.Parent] || s.Parent == s.SpanID,
		}
		if s.Parent.IsValid() {
			out.ParentSpanID = s.Parent.String()
		}
		for _, l := range s.Links {
			out.Links = append(out.Links, SpanRef{TraceID: l.TraceID().String(), SpanID: l.SpanID().String()})
		}
		if !out.Root {
			children[s.Parent] = append(children[s.Parent], i)
		}
		t.Spans[i] = out
	}
	// Walked from the roots; visited guards against spans that claim each other as parent,
	// which a buggy or hostile process could export.
	visited := make([]bool, len(spans))
	var walk func(i, depth int) SpanNode
	walk = func(i, depth int) SpanNode {
		visited[i] = true
		t.Spans[i].Depth = depth
		n := SpanNode{SpanID: t.Spans[i].SpanID}
		for _, c := range children[spans[i].SpanID] {
			if !visited[c] {
				n.Children = append(n.Children, walk(c, depth+1))
			}
		}
		return n
	}
	for i := range spans {
		if t.Spans[i].Root {
			t.Tree = append(t.Tree, walk(i, 0))
		}
	}
	for i := range spans {
		if !visited[i] { // in a cycle: shown from its earliest span
			t.Spans[i].Root = true
			t.Tree = append(t.Tree, walk(i, 0))
		}
	}
	return t
}

// someAttributes keeps a few of attrs, first by key, values cut short: enough to tell
// spans apart on a page, bounded whatever a service records.
func someAttributes(attrs map[string]string) map[string]string {
	if len(attrs) == 0 {
		return nil
	}
	keys := make([]string, 0, len(attrs))
	for k := range attrs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make(map[string]string, min(len(keys), maxSpanAttributes))
	for _, k := range keys[:min(len(keys), maxSpanAttributes)] {
		v := attrs[k]
		if len(v) > maxAttributeValue {
			v = strings.ToValidUTF8(v[:maxAttributeValue], "") + "…"
		}
		out[k] = v
	}
	return out
}

// ms is d in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
