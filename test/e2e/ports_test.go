package e2e

import (
	"net"
	"os/exec"
	"strings"
	"testing"
)

// TestUpWithDefaultPortsTaken: `up` with its default addresses taken (8080 is taken on many a
// developer's machine) starts all the same, on free ports it prints; an address given by flag
// that is taken fails loudly, naming it.
func TestUpWithDefaultPortsTaken(t *testing.T) {
	defaults := []string{"127.0.0.1:8080", "127.0.0.1:8081", "127.0.0.1:8090", "127.0.0.1:8091", "127.0.0.1:9102", "127.0.0.1:8070"}
	for _, addr := range defaults {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue // taken already: all the better
		}
		t.Cleanup(func() { ln.Close() })
	}
	up := startIn(t, t.TempDir(), "up", "--data-dir", t.TempDir(), "--nodes", "1")
	out := up.Output.String()
	for _, addr := range defaults {
		if strings.Contains(out, "http://"+addr+"/") {
			t.Errorf("up prints the taken address %s:\n%s", addr, out)
		}
	}
	for _, line := range []string{"metrics  http://127.0.0.1:", "webhook  http://127.0.0.1:", "scm      http://127.0.0.1:", "console  http://127.0.0.1:"} {
		if !strings.Contains(out, line) {
			t.Errorf("up does not print %q:\n%s", line, out)
		}
	}
	up.Kubectl(t, "get", "crdipc", "-A")

	taken := defaults[0]
	b, err := exec.Command(binary, "up", "--data-dir", t.TempDir(), "--nodes", "1", "--metrics-addr", taken).CombinedOutput()
	if err == nil || !strings.Contains(string(b), "address already in use") {
		t.Fatalf("up with --metrics-addr %s taken: err=%v, want it refused saying so:\n%s", taken, err, b)
	}
}
