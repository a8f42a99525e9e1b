package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/crdipc/crdipc/internal/bench"
)

// `crdipc bench up` starts the README's `crdipc up` (default flags, a fresh directory),
// reads its phases and start time, interrupts it and reads how long it took to stop.
func TestBenchUp(t *testing.T) {
	out := filepath.Join(t.TempDir(), "up.json")
	b, err := exec.Command(binary, "bench", "up", "--starts", "1", "--warmup", "0", "--json", out).CombinedOutput()
	if err != nil {
		t.Fatalf("bench up: %v\n%s", err, b)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var u bench.Up
	if err := json.Unmarshal(data, &u); err != nil {
		t.Fatal(err)
	}
	if len(u.Starts) != 1 || !slices.Equal(u.Args, []string{"up"}) {
		t.Fatalf("starts %d, args %v; want 1 start of `up`:\n%s", len(u.Starts), u.Args, data)
	}
	s := u.Starts[0]
	var names []string
	total := 0.0
	for _, p := range s.Phases {
		names = append(names, p.Name)
		total += p.Ms
	}
	for _, want := range []string{"certificates", "etcd", "kube-apiserver serving", "services"} {
		if !slices.Contains(names, want) {
			t.Errorf("no phase %q in %v", want, names)
		}
	}
	// The phases are consecutive parts of the start: together no longer than it, give or
	// take rounding, as up prints them: the start to 10 ms, each phase to 1 ms (a start
	// printed as 2.67 s had phases of 2,672 ms in all).
	slack := 5 + 0.5*float64(len(s.Phases))
	if s.Seconds <= 0 || total > s.Seconds*1000+slack || u.MedianSeconds != s.Seconds || s.StopSeconds <= 0 {
		t.Errorf("up in %v s, phases %v ms in all, median %v s, stopped in %v s:\n%s", s.Seconds, total, u.MedianSeconds, s.StopSeconds, b)
	}
}
