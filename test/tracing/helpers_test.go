package tracing

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/ipc"
)

// traceparentOf is the sampled span context stored on obj (ipc.TraceParentAnnotation).
func traceparentOf(t *testing.T, obj metav1.Object) trace.SpanContext {
	t.Helper()
	sc := trace.SpanContextFromContext(ipc.ExtractTraceContext(context.Background(), obj))
	if !sc.IsSampled() {
		t.Fatalf("%s/%s: traceparent %q is not a sampled span context", obj.GetNamespace(), obj.GetName(), obj.GetAnnotations()[ipc.TraceParentAnnotation])
	}
	return sc
}

// waitTrace waits until the collector holds spans of trace id for which check returns nil,
// and returns them. Spans reach the collector when their batches are exported; some end
// after the request was answered (the sender's watch closes then).
func waitTrace(t *testing.T, id trace.TraceID, what string, check func(tr traceSpans) error) traceSpans {
	t.Helper()
	var tr traceSpans
	testenv.Eventually(t, 30*time.Second, what, func(ctx context.Context) (bool, error) {
		if err := provider.ForceFlush(ctx); err != nil {
			return false, err
		}
		tr = newTraceSpans(otlp.Spans(func(s span) bool { return s.TraceID == id }))
		if err := check(tr); err != nil {
			return false, err
		}
		return true, nil
	})
	return tr
}

// traceSpans are the spans of one trace, as the collector received them.
type traceSpans struct {
	all  []span
	byID map[trace.SpanID]span
}

func newTraceSpans(spans []span) traceSpans {
	tr := traceSpans{all: spans, byID: map[trace.SpanID]span{}}
	for _, s := range spans {
		tr.byID[s.SpanID] = s
	}
	return tr
}

// under says whether s descends from the span with the given ID, every span between
// them received too.
func (tr traceSpans) under(s span, ancestor trace.SpanID) bool {
	for p := s.Parent; p.IsValid(); p = tr.byID[p].Parent {
		if p == ancestor {
			return true
		}
		if _, ok := tr.byID[p]; !ok {
			return false
		}
	}
	return false
}

// of returns the spans of service named name.
func (tr traceSpans) of(service, name string) []span {
	return filter(tr.all, func(s span) bool { return s.Service == service && s.Name == name })
}

func (tr traceSpans) log(t *testing.T) {
	for _, s := range tr.all {
		t.Logf("%s %v", s, s.Attributes)
	}
}
