package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/bench"
	"github.com/crdipc/crdipc/internal/cpushare"
)

// TestBenchScale runs `crdipc bench scale` at tiny sizes, so the whole path — embedded
// control plane, the books service of the table, the population, every measurement, the
// cleanup — is exercised. It checks that every figure was measured and counts what it
// should, never how fast or how big: goals are reported by the full-size benchmark.
func TestBenchScale(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "scale.json")
	cmd := newBenchCommand()
	var out, stderr bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"scale", "--sizes", "100,300", "--calls", "20", "--idle-window", "1s", "--json", jsonPath})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("bench scale: %v\n%s%s", err, out.String(), stderr.String())
	}
	t.Logf("\n%s", out.String())

	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var s bench.Scale
	if err := json.Unmarshal(data, &s); err != nil {
		t.Fatalf("parsing %s: %v", jsonPath, err)
	}
	if !s.InProcess || s.Baseline.RSSBytes == 0 || s.Baseline.HeapBytes == 0 {
		t.Errorf("in process %v, baseline %+v: want the embedded process's memory", s.InProcess, s.Baseline)
	}
	if len(s.Steps) != 2 || s.Steps[0].Books != 100 || s.Steps[1].Books != 300 {
		t.Fatalf("steps %+v, want 100 and 300 Books", s.Steps)
	}
	for _, st := range s.Steps {
		// The receiver records an Event before it writes Ready: every Ready Book has one.
		if st.Events != st.Books {
			t.Errorf("%d Books: %d Events, want one per Book", st.Books, st.Events)
		}
		if st.CacheBytesPer <= 0 || st.CacheCopies <= 0 || st.CacheSyncMs <= 0 || st.ListMs <= 0 || st.PagedListMs <= 0 {
			t.Errorf("%d Books: cache %.0f bytes/Book over %d copies, sync %.1f ms, lists %.1f and %.1f ms: want all positive",
				st.Books, st.CacheBytesPer, st.CacheCopies, st.CacheSyncMs, st.ListMs, st.PagedListMs)
		}
		if r := st.CacheBytesRounds; len(r) != 3 || st.CacheBytesPer < slices.Min(r) || st.CacheBytesPer > slices.Max(r) {
			t.Errorf("%d Books: cache bytes/Book %.0f from rounds %v: want the median of three", st.Books, st.CacheBytesPer, r)
		}
		if st.Call.N != 20 || st.Call.P50 <= 0 || st.Call.P99 < st.Call.P50 || st.CallP50Ratio <= 0 {
			t.Errorf("%d Books: Calls %+v, p50 ratio %v", st.Books, st.Call, st.CallP50Ratio)
		}
		if st.Memory.RSSBytes == 0 || st.Memory.HeapBytes == 0 || st.Memory.PeakRSSBytes < st.Memory.RSSBytes || st.IdleCores < 0 {
			t.Errorf("%d Books: memory %+v, idle %v cores", st.Books, st.Memory, st.IdleCores)
		}
		if st.PopulateSeconds <= 0 || st.CreatesPerSec <= 0 || st.ReadyPerSec <= 0 {
			t.Errorf("%d Books: populate %.1f s, %.0f creates/s, %.0f Ready/s", st.Books, st.PopulateSeconds, st.CreatesPerSec, st.ReadyPerSec)
		}
	}
	// Idle CPU is divided between the process's components; only they, the bench and the
	// unlabelled (the Go runtime) may appear.
	if s.IdleByComponentError != "" {
		t.Errorf("idle CPU not divided by component: %s", s.IdleByComponentError)
	}
	known := map[string]bool{"etcd": true, "kube-apiserver": true, "kube-controller-manager": true, "books": true, "bench": true, cpushare.Unattributed: true}
	for i, by := range append([]cpushare.Cores{s.BaselineIdleCoresBy}, s.Steps[0].IdleCoresBy, s.Steps[1].IdleCoresBy) {
		for name, cores := range by {
			if !known[name] || cores < 0 {
				t.Errorf("idle CPU %d: %s %.3f cores: want a known component and no negative share", i, name, cores)
			}
		}
	}
	if s.Steps[0].CallP50Ratio != 1 {
		t.Errorf("first size's Call p50 ratio %v, want 1", s.Steps[0].CallP50Ratio)
	}
	if s.RSSMet != nil {
		t.Errorf("RSS goal judged at %d Books; it is about %d", s.Steps[1].Books, bench.ScaleRSSGoalSize)
	}
	if s.CleanupError != "" {
		t.Errorf("cleanup: %s", s.CleanupError)
	}
	for _, row := range []string{"heap/cached Book (bytes)", "ipc.Call p50 / first size", "process RSS (MiB)", "cleanup: namespace deleted"} {
		if !strings.Contains(out.String(), row) {
			t.Errorf("output lacks %q", row)
		}
	}
}
