package upproc

import (
	"fmt"
	"strings"
	"testing"
)

// A process that writes both streams while it starts, as up does: its export line is found,
// both streams are kept, and Ctrl-C stops it. Under -race this also checks that stderr's
// copier and the stdout scanner share the buffer safely.
func TestStartAndStop(t *testing.T) {
	script := `trap 'kill $! 2>/dev/null; exit 0' INT
for i in 1 2 3 4 5 6 7 8; do echo "stderr $i" >&2; echo "stdout $i"; done
echo "export KUBECONFIG=/tmp/kubeconfig"
echo "crdipc is up" >&2
sleep 60 >/dev/null 2>&1 &
wait`
	p := Start(t, Options{Binary: "sh", Args: []string{"-c", script}, Env: []string{"CRDIPC_TEST=1"}})
	if p.Kubeconfig != "/tmp/kubeconfig" {
		t.Errorf("kubeconfig %q", p.Kubeconfig)
	}
	if out, err := p.Run("sh", "-c", "echo $KUBECONFIG $CRDIPC_TEST"); err != nil || strings.TrimSpace(out) != "/tmp/kubeconfig 1" {
		t.Errorf("a command on the process sees %q (%v), want its kubeconfig and env", out, err)
	}
	p.Stop(t)
	if exited, err := p.Exited(); !exited || err != nil {
		t.Fatalf("after Stop: exited %v, %v", exited, err)
	}
	out := p.Output.String()
	for _, want := range []string{"stdout 8", "stderr 8", "export KUBECONFIG=", "crdipc is up"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// recorder is a testing.TB that keeps what a helper reports instead of failing the test.
type recorder struct {
	testing.TB
	errors []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// A race the detector reports in up's output fails the test that stopped it, even when
// up exits cleanly (make test-race builds up with -race; a race is a bug, not a warning).
func TestStopReportsDataRaces(t *testing.T) {
	script := `trap 'echo "==================" >&2; echo "WARNING: DATA RACE" >&2; echo "Write at 0x00c by goroutine 7:" >&2; exit 0' INT
echo "export KUBECONFIG=/tmp/kubeconfig"
sleep 60 >/dev/null 2>&1 &
wait`
	p := Start(t, Options{Binary: "sh", Args: []string{"-c", script}})
	r := &recorder{TB: t}
	p.Stop(r)
	if len(r.errors) != 1 || !strings.Contains(r.errors[0], "1 data race") || !strings.Contains(r.errors[0], "goroutine 7") {
		t.Errorf("Stop reported %q, want the one data race with its report", r.errors)
	}
}
