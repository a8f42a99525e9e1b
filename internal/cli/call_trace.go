package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/crdipc/crdipc/internal/console"
	"github.com/crdipc/crdipc/internal/tracing"
)

// traceSpan is a span as `call --trace` prints it: from this process's own store (the
// sender's spans) or from up's console (kube-apiserver's and the receivers').
type traceSpan struct {
	id, parent, service, name string
	start                     time.Time
	duration                  time.Duration
}

// traceSpans gathers trace id's spans: the sender's from store, and the rest from the
// console at consoleURL, asked until a receiver's spans are there and the count holds
// still, or wait passes. It says why the console's were not had, if they were not.
func traceSpans(ctx context.Context, store *tracing.Store, id trace.TraceID, consoleURL string, wait time.Duration) ([]traceSpan, error) {
	byID := map[string]traceSpan{}
	local, _ := store.Trace(id)
	for _, s := range local {
		byID[s.SpanID.String()] = traceSpan{id: s.SpanID.String(), parent: parentID(s.Parent), service: s.Service, name: s.Name, start: s.Start, duration: s.Duration()}
	}
	if consoleURL == "" {
		return sorted(byID), nil
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	url := strings.TrimSuffix(consoleURL, "/") + "/traces/" + id.String()
	var lastErr error
	last, stable := -1, 0
	for {
		remote, err := fetchTrace(ctx, url)
		if err == nil {
			lastErr = nil
			for _, s := range remote {
				byID[s.SpanID] = traceSpan{id: s.SpanID, parent: s.ParentSpanID, service: s.Service, name: s.Name, start: s.Start, duration: time.Duration(s.DurationMS * float64(time.Millisecond))}
			}
			if len(byID) == last {
				stable++
			} else {
				last, stable = len(byID), 0
			}
			// Spans end a little after the reply: the receiver's reconcile ends after the
			// status write the sender saw. Two unchanged readings in a row are taken as all.
			if stable >= 2 && hasReceiver(byID) {
				return sorted(byID), nil
			}
		} else {
			lastErr = err
		}
		select {
		case <-ctx.Done():
			return sorted(byID), lastErr
		case <-time.After(150 * time.Millisecond):
		}
	}
}

func parentID(p trace.SpanID) string {
	if !p.IsValid() {
		return ""
	}
	return p.String()
}

// hasReceiver says whether a span other than the sender's own reached the store: a
// receiver's reconcile.
func hasReceiver(spans map[string]traceSpan) bool {
	for _, s := range spans {
		if strings.HasPrefix(s.name, "reconcile ") {
			return true
		}
	}
	return false
}

func fetchTrace(ctx context.Context, url string) ([]console.TraceSpan, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("asking up's console for the trace: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("asking up's console for the trace: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	var t console.Trace
	if err := json.NewDecoder(resp.Body).Decode(&t); err != nil {
		return nil, fmt.Errorf("reading up's console's trace: %w", err)
	}
	return t.Spans, nil
}

func sorted(byID map[string]traceSpan) []traceSpan {
	spans := make([]traceSpan, 0, len(byID))
	for _, s := range byID {
		spans = append(spans, s)
	}
	slices.SortFunc(spans, func(a, b traceSpan) int { return cmp.Or(a.start.Compare(b.start), strings.Compare(a.id, b.id)) })
	return spans
}

// printTraceTree prints the spans as a tree under their parents, each with its service,
// operation and duration; a span whose parent is not among them is a root.
func printTraceTree(out io.Writer, spans []traceSpan) {
	present := map[string]bool{}
	for _, s := range spans {
		present[s.id] = true
	}
	children := map[string][]traceSpan{}
	for _, s := range spans {
		p := s.parent
		if !present[p] {
			p = ""
		}
		children[p] = append(children[p], s)
	}
	var walk func(parent string, depth int)
	walk = func(parent string, depth int) {
		for _, s := range children[parent] {
			fmt.Fprintf(out, "  %s%-*s %-*s %9.2f ms\n", strings.Repeat("  ", depth), 18, s.service, max(0, 44-2*depth), s.name, float64(s.duration.Microseconds())/1000)
			walk(s.id, depth+1)
		}
	}
	walk("", 0)
}
