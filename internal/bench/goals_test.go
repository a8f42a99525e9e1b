package bench

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// TestGoalJudgement: a figure on its goal meets it (but for floating point's last bits),
// one beyond misses it, and a figure or floor that is zero or not a number misses it with
// a word saying why, never meets it by default.
func TestGoalJudgement(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name       string
		g          Goal
		met        bool
		unmeasured string
	}{
		{"ratio on an at-most goal", ratioGoal("b", "f", 7.2, 6, AtMost, 1.2), true, ""},
		{"ratio just above an at-most goal", ratioGoal("b", "f", 7.27, 6, AtMost, 1.2), false, ""},
		{"ratio on an at-least goal", ratioGoal("b", "f", 0.9*7, 7, AtLeast, 0.9), true, ""},
		{"ratio just below an at-least goal", ratioGoal("b", "f", 0.89, 1, AtLeast, 0.9), false, ""},
		{"floor of 0", ratioGoal("b", "f", 5, 0, AtMost, 1.2), false, "the floor is 0"},
		{"floor not a number", ratioGoal("b", "f", 5, nan, AtMost, 1.2), false, "the floor is not a number"},
		{"infinite floor", ratioGoal("b", "f", 5, math.Inf(1), AtLeast, 0.9), false, "the floor is not a number"},
		{"figure of 0 on an at-most goal", ratioGoal("b", "f", 0, 3, AtMost, 1.2), false, "the figure is 0"},
		{"figure not a number", ratioGoal("b", "f", nan, 3, AtMost, 1.2), false, "the figure is not a number"},
		{"absolute on an at-most goal", absoluteGoal("b", "f", 2.5, AtMost, 2.5, "s"), true, ""},
		{"absolute above an at-most goal", absoluteGoal("b", "f", 2.51, AtMost, 2.5, "s"), false, ""},
		{"absolute on an at-least goal", absoluteGoal("b", "f", 100, AtLeast, 100, "MiB/s"), true, ""},
		{"absolute on a below goal", absoluteGoal("b", "f", 2048, Below, 2048, "MiB"), false, ""},
		{"absolute under a below goal", absoluteGoal("b", "f", 2047.9, Below, 2048, "MiB"), true, ""},
		{"absolute not a number", absoluteGoal("b", "f", nan, AtMost, 2.5, "s"), false, "the figure is not a number"},
		{"unknown operator", absoluteGoal("b", "f", 1, "=", 1, "s"), false, `no such comparison "="`},
		{"unmeasured", unmeasuredGoal("b", "f", AtLeast, 0.9, Ratio, "not run with 8 senders"), false, "not run with 8 senders"},
	} {
		g := tc.g
		if g.Met != tc.met || g.Unmeasured != tc.unmeasured {
			t.Errorf("%s: met %v, unmeasured %q; want %v, %q", tc.name, g.Met, g.Unmeasured, tc.met, tc.unmeasured)
		}
		switch v := g.Verdict(); {
		case tc.met && v != "met":
			t.Errorf("%s: verdict %q, want met", tc.name, v)
		case !tc.met && tc.unmeasured == "" && v != "missed":
			t.Errorf("%s: verdict %q, want missed", tc.name, v)
		case tc.unmeasured != "" && v != "missed ("+tc.unmeasured+")":
			t.Errorf("%s: verdict %q, want it missed, saying why", tc.name, v)
		}
		if tc.unmeasured != "" && (g.Value != 0 || g.ValueText() != "-") {
			t.Errorf("%s: value %v (%q), want none", tc.name, g.Value, g.ValueText())
		}
		// encoding/json refuses NaN and infinities: a goal without a figure must still go
		// into bench all's JSON.
		if _, err := json.Marshal(g); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestGoalText(t *testing.T) {
	for _, tc := range []struct {
		g           Goal
		value, goal string
	}{
		{ratioGoal("b", "f", 1.07, 1, AtMost, 1.2), "1.07×", "≤ 1.2×"},
		{ratioGoal("b", "f", 0.81, 1, AtLeast, 0.9), "0.81×", "≥ 0.9×"},
		{absoluteGoal("b", "f", 2.62, AtMost, 2.5, "s"), "2.62 s", "≤ 2.5 s"},
		{absoluteGoal("b", "f", 428.4, AtLeast, 100, "MiB/s"), "428 MiB/s", "≥ 100 MiB/s"},
		{absoluteGoal("b", "f", 1345, AtMost, 2048, "bytes"), "1345 bytes", "≤ 2048 bytes"},
	} {
		if v, g := tc.g.ValueText(), tc.g.GoalText(); v != tc.value || g != tc.goal {
			t.Errorf("%+v: %q %q, want %q %q", tc.g, v, g, tc.value, tc.goal)
		}
	}
}

// TestRoundTripGoals: latency against the floor's create→status→watch, throughput at 8
// and 32 senders against the three writes without ipc; a level not run is missed, saying
// so.
func TestRoundTripGoals(t *testing.T) {
	rt := &RoundTrip{
		Floor:               &Floor{StatusRoundTrip: Latencies{P50: 5, P99: 10}},
		Latency:             Latencies{P50: 6, P99: 16},
		CallsPerSec:         map[int]float64{1: 90, 8: 140},
		RequestWritesPerSec: map[int]float64{1: 100, 8: 150},
	}
	goals := rt.Goals()
	if len(goals) != 4 {
		t.Fatalf("%d goals, want 4: %+v", len(goals), goals)
	}
	want := []struct {
		value float64
		met   bool
	}{{1.2, true}, {1.6, false}, {140.0 / 150, true}, {0, false}}
	for i, w := range want {
		if g := goals[i]; math.Abs(g.Value-w.value) > 1e-9 || g.Met != w.met || g.Bench != NameRoundTrip {
			t.Errorf("goal %d %q: %v met %v, want %v met %v", i, g.Figure, g.Value, g.Met, w.value, w.met)
		}
	}
	if g := goals[3]; !strings.Contains(g.Figure, "32 senders") || g.Unmeasured != "not run with 32 senders" {
		t.Errorf("goal at 32 senders, not run: %+v", g)
	}
	rt.Floor = nil
	if g := rt.Goals()[0]; g.Met || g.Unmeasured != "the floor is 0" {
		t.Errorf("without a floor: %+v, want missed for want of a floor", g)
	}
}

// TestVolumeGoals: reads against the local file, writes against the local file ÷ the
// replicas that share its disk, the rebuild in MiB/s.
func TestVolumeGoals(t *testing.T) {
	v := &Volume{ReplicationFactor: 3, Jobs: []FioRatio{
		{Name: "seqWrite", Metric: "MiB/s", Volume: FioResult{MiBPerSec: 90}, Local: FioResult{MiBPerSec: 300}, Divisor: 3, Goal: SeqWriteGoal},
		{Name: "seqRead", Metric: "MiB/s", Volume: FioResult{MiBPerSec: 150}, Local: FioResult{MiBPerSec: 300}, Divisor: 1, Goal: SeqReadGoal},
		{Name: "randWrite", Metric: "IOPS", Volume: FioResult{IOPS: 400, MiBPerSec: 999, CPUPerOpMicros: 150}, Local: FioResult{IOPS: 3000, CPUPerOpMicros: 20}, Divisor: 3, Goal: RandWriteGoal, CPUGoal: RandWriteCPUGoal},
		{Name: "other", Metric: "MiB/s", Volume: FioResult{MiBPerSec: 1}, Local: FioResult{MiBPerSec: 1}},
	}, Rebuild: Rebuild{MiBPerSec: 99, Seconds: 1}}
	goals := v.Goals()
	want := []struct {
		figure string
		value  float64
		met    bool
	}{
		{"seq write / (local file ÷ 3 replicas)", 0.9, true},
		{"seq read / local file", 0.5, false},
		{"4 KiB rand write IOPS / (local file ÷ 3 replicas)", 0.4, false},
		{"CPU per 4 KiB rand write / local file's", 7.5, false},
		{"replica rebuild", 99, false},
	}
	if len(goals) != len(want) {
		t.Fatalf("%d goals, want %d (a job without a goal has none): %+v", len(goals), len(want), goals)
	}
	for i, w := range want {
		if g := goals[i]; g.Figure != w.figure || math.Abs(g.Value-w.value) > 1e-9 || g.Met != w.met {
			t.Errorf("goal %d: %q %v met %v, want %q %v met %v", i, g.Figure, g.Value, g.Met, w.figure, w.value, w.met)
		}
	}
	v.Rebuild = Rebuild{}
	if g := v.Goals()[4]; g.Met || g.Unmeasured == "" {
		t.Errorf("rebuild not timed: %+v, want missed, saying why", g)
	}
	// The CPU goal is an upper bound; a side without a CPU figure leaves it unmeasured.
	v.Jobs[2].Volume.CPUPerOpMicros = 140
	if g := v.Goals()[3]; !g.Met || math.Abs(g.Value-7) > 1e-9 {
		t.Errorf("CPU 140 µs against the local file's 20: %+v, want 7× and met", g)
	}
	v.Jobs[2].Local.CPUPerOpMicros = 0
	if g := v.Goals()[3]; g.Met || g.Unmeasured == "" {
		t.Errorf("no local CPU figure: %+v, want missed, saying why", g)
	}
}

// TestScaleGoals: the RSS goal is about 100,000 Books of a process the bench reads; below
// that size it is missed as not measured, not judged.
func TestScaleGoals(t *testing.T) {
	s := &Scale{InProcess: true, Steps: []ScaleStep{
		{Books: 100, Call: Latencies{P50: 10}, CacheBytesPer: 1500},
		{Books: 300, Call: Latencies{P50: 11}, CacheBytesPer: 1400},
	}}
	goals := s.Goals()
	if len(goals) != 3 || !goals[0].Met || !goals[1].Met || goals[2].Met || goals[2].Unmeasured != "largest size 300 Books" {
		t.Errorf("goals %+v", goals)
	}
	s.Steps[1].Books, s.Steps[1].Memory.RSSBytes = ScaleRSSGoalSize, 3<<30
	if g := s.Goals()[2]; g.Met || g.Unmeasured != "" || g.Value != 3072 {
		t.Errorf("RSS 3 GiB at %d Books: %+v, want missed at 3072 MiB", ScaleRSSGoalSize, g)
	}
}

// TestCollectGoals: the goals of the benches that ran, in the order they run, and [] in
// the JSON when none did.
func TestCollectGoals(t *testing.T) {
	a := &All{}
	a.Goals = a.CollectGoals()
	data, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"goals":[]`) {
		t.Errorf("no bench: %s, want an empty list of goals", data)
	}
	a = &All{Up: &Up{Starts: []UpStart{{Seconds: 2}}, MedianSeconds: 2}, Storage: &Storage{CreateToReady: Latencies{P50: 30}, IdealLatencyMs: 10},
		Webhook: &Webhook{DeliveriesPerSec: 90, CeilingDeliveriesPerSec: 100, Latency: Latencies{P99: 10}, FloorLatency: Latencies{P99: 10}}}
	var benches []string
	for _, g := range a.CollectGoals() {
		benches = append(benches, g.Bench)
	}
	if got := strings.Join(benches, ","); got != "up,webhook,webhook,storage" {
		t.Errorf("goals of %s, want up, webhook's two, storage", got)
	}
}
