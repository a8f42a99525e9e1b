package e2e

import (
	"regexp"
	"strings"
	"testing"
)

// consoleURL is the console address up printed.
func consoleURL(t *testing.T, up *upProcess) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s*console\s+(http://\S+/)\s*$`).FindStringSubmatch(up.Output.String())
	if m == nil {
		t.Fatalf("up did not print the console address:\n%s", up.Output.String())
	}
	return m[1]
}

var (
	traceIDLine = regexp.MustCompile(`(?m)^trace ([0-9a-f]{32})$`)
	// A row of call's span tree: indent, service, operation, duration.
	spanTreeRow = regexp.MustCompile(`^ +(\S+) +(.+?) +\d+\.\d\d ms$`)
)

// callTraced runs `crdipc call --apply -f file --trace` on up, asking the console at console
// for the spans that are not the call's own, and returns the trace ID it printed. Its span
// tree must hold the sender's call span, kube-apiserver's spans and the books receiver's
// reconcile: one request, traced end to end.
func callTraced(t *testing.T, up *upProcess, console, file string) string {
	t.Helper()
	out, err := up.Run(binary, "call", "--apply", "-f", file, "--trace", "--console", console)
	if err != nil {
		t.Fatalf("crdipc call --trace: %v\n%s", err, out)
	}
	m := traceIDLine.FindStringSubmatchIndex(out)
	if m == nil {
		t.Fatalf("crdipc call --trace printed no `trace <32 hex>` line:\n%s", out)
	}
	id := out[m[2]:m[3]]
	// The tree is every line after the trace line; a note in parentheses says the console's
	// spans are missing from it.
	if strings.Contains(out[m[1]:], "(only this process's spans") {
		t.Fatalf("crdipc call --trace could not read up's console:\n%s", out)
	}
	has := map[string]bool{}
	for _, line := range strings.Split(strings.Trim(out[m[1]:], "\n"), "\n") {
		r := spanTreeRow.FindStringSubmatch(line)
		if r == nil {
			t.Fatalf("crdipc call --trace: %q is not a span tree row:\n%s", line, out)
		}
		has[r[1]] = true
		has[r[1]+"/"+r[2]] = true
	}
	for _, want := range []string{"crdipc-call/call Book", "kube-apiserver", "books/reconcile Book"} {
		if !has[want] {
			t.Errorf("crdipc call --trace: the span tree lacks %s:\n%s", want, out)
		}
	}
	t.Logf("crdipc call --trace:\n%s", out[m[0]:])
	return id
}
