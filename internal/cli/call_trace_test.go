package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestPrintTraceTree: children under their parent in start order, a span whose parent is
// not among them printed as a root, each with its service and duration.
func TestPrintTraceTree(t *testing.T) {
	t0 := time.Now()
	spans := sorted(map[string]traceSpan{
		"a": {id: "a", service: "crdipc-call", name: "call Book", start: t0, duration: 20 * time.Millisecond},
		"b": {id: "b", parent: "a", service: "kube-apiserver", name: "POST books", start: t0.Add(time.Millisecond), duration: 5 * time.Millisecond},
		"c": {id: "c", parent: "a", service: "books", name: "reconcile Book", start: t0.Add(7 * time.Millisecond), duration: 9 * time.Millisecond},
		"d": {id: "d", parent: "c", service: "books", name: "write status", start: t0.Add(8 * time.Millisecond), duration: 4 * time.Millisecond},
		"e": {id: "e", parent: "gone", service: "kube-apiserver", name: "PUT books/status", start: t0.Add(9 * time.Millisecond), duration: 2500 * time.Microsecond},
	})
	var out bytes.Buffer
	printTraceTree(&out, spans)
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	want := []struct{ indent, service, name, ms string }{
		{"  ", "crdipc-call", "call Book", "20.00 ms"},
		{"    ", "kube-apiserver", "POST books", "5.00 ms"},
		{"    ", "books", "reconcile Book", "9.00 ms"},
		{"      ", "books", "write status", "4.00 ms"},
		{"  ", "kube-apiserver", "PUT books/status", "2.50 ms"},
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(want), out.String())
	}
	for i, w := range want {
		l := lines[i]
		if !strings.HasPrefix(l, w.indent+w.service) || strings.HasPrefix(l, w.indent+" ") || !strings.Contains(l, w.name) || !strings.HasSuffix(l, w.ms) {
			t.Errorf("line %d %q: want %q indented %d, %q, %q", i, l, w.service, len(w.indent), w.name, w.ms)
		}
	}
}
