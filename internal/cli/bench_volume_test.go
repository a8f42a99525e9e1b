package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/bench"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/require"
)

// TestBenchVolume runs `crdipc bench volume` at a tiny size, so the whole path — embedded
// control plane, nodes, driver, staging, fio on both sides, the rebuild — is exercised. It
// checks that every figure was measured, never how fast: speed goals are reported by the
// full-size benchmark, and this machine may be busy.
func TestBenchVolume(t *testing.T) {
	require.Tool(t, "CRDIPC_REQUIRE_FIO", "fio")
	testenv.RequireMounts(t)
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "volume.json")
	cmd := newBenchCommand()
	var out, stderr bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{
		"volume", "--dir", dir, "--json", jsonPath,
		"--volume-size", "64Mi", "--seq-size", "8Mi", "--seq-iodepth", "4",
		"--rand-size", "4Mi", "--rand-runtime", "1s", "--rand-iodepth", "4",
		"--rebuild-size", "32Mi", "--rebuild-data", "8Mi",
		// Tests of other packages run alongside: leave their page cache alone.
		"--drop-caches=false",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("bench volume: %v\n%s%s", err, out.String(), stderr.String())
	}
	t.Logf("\n%s", out.String())

	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var v bench.Volume
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("parsing %s: %v", jsonPath, err)
	}
	want := map[string]string{"seqWrite": "MiB/s", "seqRead": "MiB/s", "randWrite": "IOPS"}
	if len(v.Jobs) != len(want) {
		t.Fatalf("%d jobs, want %d: %+v", len(v.Jobs), len(want), v.Jobs)
	}
	for _, j := range v.Jobs {
		if want[j.Name] != j.Metric {
			t.Errorf("job %s measures %q, want %q", j.Name, j.Metric, want[j.Name])
		}
		for side, r := range map[string]bench.FioResult{"volume": j.Volume, "local": j.Local} {
			if r.Bytes <= 0 || r.MiBPerSec <= 0 || r.IOPS <= 0 || r.ClatP50 <= 0 || r.CPUSeconds <= 0 || r.CPUPerOpMicros <= 0 {
				t.Errorf("job %s on the %s side: %+v, want every figure positive", j.Name, side, r)
			}
		}
		if j.CPURatio <= 0 || math.Abs(j.CPURatio-j.Volume.CPUPerOpMicros/j.Local.CPUPerOpMicros) > 1e-9 {
			t.Errorf("job %s: CPU ratio %v, want the volume's CPU per request over the local file's", j.Name, j.CPURatio)
		}
		if j.Ratio <= 0 {
			t.Errorf("job %s: ratio %v", j.Name, j.Ratio)
		}
		// A write reaches the one disk once per replica: its goal is against the local
		// file's figure divided by them.
		divisor := v.ReplicationFactor
		if j.Name == "seqRead" {
			divisor = 1
		}
		if j.Divisor != divisor || j.Goal <= 0 || math.Abs(j.GoalRatio-j.Ratio*float64(divisor)) > 1e-9 {
			t.Errorf("job %s: divisor %d, goal %v, goal ratio %v (ratio %v); want divisor %d", j.Name, j.Divisor, j.Goal, j.GoalRatio, j.Ratio, divisor)
		}
		row := tableRow(out.String(), j.Description)
		if row == nil {
			t.Errorf("table lacks job %s (%q)", j.Name, j.Description)
			continue
		}
		// The ceiling's CPU per request, the frontend's floor, ends the row.
		if c := j.Ceiling; c == nil || c.CPUPerOpMicros <= 0 {
			t.Errorf("job %s: ceiling %+v, want its CPU per request measured", j.Name, c)
		} else if want := fmt.Sprintf("%.0f", c.CPUPerOpMicros); row[len(row)-1] != want {
			t.Errorf("job %s: row %q, want the ceiling's CPU per request %s last", j.Name, row, want)
		}
	}
	if r := v.Rebuild; r.AllocatedBytes < 8<<20 || r.Seconds <= 0 || r.MiBPerSec <= 0 {
		t.Errorf("rebuild %+v: want at least the 8 MiB written allocated, and a positive time and rate", r)
	}
	for _, g := range v.Goals() {
		if !strings.Contains(out.String(), g.Figure) || g.Unmeasured != "" {
			t.Errorf("goal %+v: want it measured and in the table", g)
		}
	}
	// Nothing left behind: the benchmark's directory, the volumes' mounts.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != filepath.Base(jsonPath) {
			t.Errorf("left in --dir: %s", e.Name())
		}
	}
}

// tableRow is the fields after the description of the table's line for a job.
func tableRow(table, desc string) []string {
	for line := range strings.Lines(table) {
		if rest, ok := strings.CutPrefix(strings.TrimLeft(line, " "), desc); ok {
			return strings.Fields(rest)
		}
	}
	return nil
}

// The A/B comparison fails on a median more than 10 % below the other build's whose runs
// also rank below (U test), naming the job; one better the same way is named and passes; a
// median that moved by chance (runs interleaved by rank) is neither.
func TestPrintVolumeAB(t *testing.T) {
	run := func(seq, rand float64) *bench.Volume {
		return &bench.Volume{Jobs: []bench.FioRatio{{Name: "seq-write", Description: "seq write", Ratio: seq}, {Name: "rand-write", Description: "rand write", Ratio: rand, CPURatio: 8, CPUGoal: 7.2}}}
	}
	runs := func(seq, rand []float64) []*bench.Volume {
		var vs []*bench.Volume
		for i := range seq {
			vs = append(vs, run(seq[i], rand[i]))
		}
		return vs
	}
	// rand-write: every run of this above every run of other; seq-write: medians 0.50 and
	// 0.48, runs interleaved.
	this := runs([]float64{0.50, 0.40, 0.90, 0.45, 0.55}, []float64{0.30, 0.31, 0.29, 0.30, 0.32})
	other := runs([]float64{0.52, 0.48, 0.10, 0.50, 0.47}, []float64{0.20, 0.21, 0.19, 0.20, 0.22})
	var out strings.Builder
	if err := printVolumeAB(&out, "new", "old", this, other); err != nil || !strings.Contains(out.String(), "better than the other build by more than 10% and by rank (U test, p ≤ 0.05): rand-write 1.50×") {
		t.Fatalf("a build better at rand-write (0.30/0.20), not at seq-write (0.50/0.48): %v\n%s", err, out.String())
	}
	out.Reset()
	err := printVolumeAB(&out, "old", "new", other, this)
	if err == nil || !strings.Contains(err.Error(), "rand-write 0.67×") || strings.Contains(err.Error(), "seq-write") {
		t.Fatalf("error %v, want rand-write named (0.20/0.30) and not seq-write (0.48/0.50):\n%s", err, out.String())
	}
	if err := printVolumeAB(&out, "new", "old", this, this); err != nil {
		t.Fatalf("a build against itself: %v", err)
	}

	// Medians 0.40 against 0.50 (0.80×), but the runs interleave by rank: chance, not a
	// regression; the row still shows the move and its p.
	noisy := runs([]float64{0.30, 0.60, 0.35, 0.62, 0.40}, []float64{0.20, 0.21, 0.19, 0.20, 0.22})
	steady := runs([]float64{0.31, 0.58, 0.61, 0.36, 0.50}, []float64{0.20, 0.21, 0.19, 0.20, 0.22})
	out.Reset()
	if err := printVolumeAB(&out, "noisy", "steady", noisy, steady); err != nil || !strings.Contains(out.String(), "0.80  1.000") {
		t.Fatalf("medians 0.80× apart with interleaved runs: %v, want no failure, the quotient and p=1.000 shown:\n%s", err, out.String())
	}
	// With three runs each no rank test can reject: the medians decide, and it says so.
	out.Reset()
	if err := printVolumeAB(&out, "noisy", "steady", noisy[:3], steady[:3]); err == nil || !strings.Contains(err.Error(), "medians only") || !strings.Contains(err.Error(), "seq-write") {
		t.Fatalf("three runs each, medians 0.35 against 0.58: %v, want seq-write failing on medians only:\n%s", err, out.String())
	}

	// CPU per request: more is worse. A build that does not measure it is not compared.
	cheaper := runs([]float64{0.50, 0.40, 0.90, 0.45, 0.55}, []float64{0.30, 0.31, 0.29, 0.30, 0.32})
	for i, v := range cheaper {
		v.Jobs[1].CPURatio = 6 + float64(i)/10
	}
	for i, v := range this {
		v.Jobs[1].CPURatio = 8 + float64(i)/10
	}
	out.Reset()
	if err := printVolumeAB(&out, "cheap", "dear", cheaper, this); err != nil || !strings.Contains(out.String(), "rand-write CPU 0.76×") {
		t.Fatalf("6.0–6.4× against 8.0–8.4× the local file's CPU: %v, want rand-write CPU 0.76× named as better:\n%s", err, out.String())
	}
	if err := printVolumeAB(&out, "dear", "cheap", this, cheaper); err == nil || !strings.Contains(err.Error(), "rand-write CPU 1.32×") {
		t.Fatalf("8.0–8.4× against 6.0–6.4×: %v, want rand-write CPU 1.32× failing", err)
	}
	// A job without a CPU goal is not compared on CPU (a short job's is mostly fio's start).
	for _, v := range cheaper {
		v.Jobs[1].CPUGoal = 0
	}
	for _, v := range this {
		v.Jobs[1].CPUGoal = 0
	}
	out.Reset()
	if err := printVolumeAB(&out, "dear", "cheap", this, cheaper); err != nil || strings.Contains(out.String(), "CPU per request") {
		t.Fatalf("8× against 6× for a job without a CPU goal: %v, want it not compared:\n%s", err, out.String())
	}
	for _, v := range cheaper {
		v.Jobs[1].CPUGoal = 7.2
	}
	old := []*bench.Volume{run(0.50, 0.30)}
	old[0].Jobs[1].CPURatio = 0
	out.Reset()
	if err := printVolumeAB(&out, "new", "old", cheaper, old); err != nil || strings.Contains(out.String(), "CPU per request") {
		t.Fatalf("against a build without CPU figures: %v, want no CPU row:\n%s", err, out.String())
	}
}
