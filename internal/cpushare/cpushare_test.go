package cpushare

import (
	"context"
	"io"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// spin burns CPU until stop is closed.
func spin(stop <-chan struct{}, n *atomic.Int64) {
	for {
		select {
		case <-stop:
			return
		default:
			n.Add(1)
		}
	}
}

func TestMeasureByComponent(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	var n atomic.Int64
	// The spinner is a grandchild of the goroutine labelled "parent": the label must pass
	// down through every go statement.
	Do("parent", func() {
		go func() {
			go spin(stop, &n)
			<-stop
		}()
	})
	Do("sleeper", func() { go func() { <-stop }() })
	// Started after Do returned: the caller's own (absent) labels must be back.
	go spin(stop, &n)

	s, err := Measure(context.Background(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("window %s, cores %v", s.Window, s.Cores)
	if s.Window < time.Second {
		t.Errorf("window %s, want at least the second asked for", s.Window)
	}
	// Two spinners on a machine that may be busy with other tests: each gets well over a
	// fifth of a core.
	if c := s.Cores["parent"]; c < 0.2 {
		t.Errorf("parent: %.3f cores, want ≥ 0.2: a grandchild's CPU was not counted as its own", c)
	}
	if c := s.Cores[Unattributed]; c < 0.2 {
		t.Errorf("%s: %.3f cores, want ≥ 0.2 (an unlabelled spinner)", Unattributed, c)
	}
	if c := s.Cores["sleeper"]; c > 0.05 {
		t.Errorf("sleeper: %.3f cores, want ~0: it only waits (did Do leave its label on the caller?)", c)
	}
	if tot := s.Cores.Total(); tot < s.Cores["parent"]+s.Cores[Unattributed] {
		t.Errorf("total %.3f below its parts %v", tot, s.Cores)
	}
}

func TestMeasureWhileAnotherProfileRuns(t *testing.T) {
	if err := pprof.StartCPUProfile(io.Discard); err != nil {
		t.Fatal(err)
	}
	defer pprof.StopCPUProfile()
	if _, err := Measure(context.Background(), 10*time.Millisecond); err == nil || !strings.Contains(err.Error(), "sampling CPU by component") {
		t.Fatalf("Measure during another CPU profile: %v, want an error saying so", err)
	}
}

func TestMeasureStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Measure(ctx, time.Hour); err != context.Canceled {
		t.Fatalf("Measure with a done context: %v, want context.Canceled", err)
	}
	// The profiler was stopped: another profile can start.
	if err := pprof.StartCPUProfile(io.Discard); err != nil {
		t.Fatalf("CPU profiler left running: %v", err)
	}
	pprof.StopCPUProfile()
}

func TestSharesOfWantsCPUSamples(t *testing.T) {
	p := &profile.Profile{SampleType: []*profile.ValueType{{Type: "alloc_space", Unit: "bytes"}}}
	if _, err := sharesOf(p, time.Second); err == nil {
		t.Fatal("a profile without CPU samples was read as CPU")
	}
}
