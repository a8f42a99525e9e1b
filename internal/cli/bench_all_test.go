package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/bench"
)

// TestBenchAll runs `crdipc bench all --quick` without scale, volume and up (they have tests
// of their own; volume needs root, and up starts the crdipc binary, which a test binary is
// not: test/e2e TestBenchUp), so the whole path — one embedded control plane, each
// bench after the previous one's namespaces are gone, the storage services, one JSON — is
// exercised; then `crdipc bench plot` draws that JSON. It checks that every figure was
// measured and every plot drawn, never how fast: this machine may be busy.
func TestBenchAll(t *testing.T) {
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "results.json")
	cmd := newBenchCommand()
	var out, stderr bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"all", "--quick", "--skip", "scale,volume,up", "--json", jsonPath})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("bench all: %v\n%s%s", err, out.String(), stderr.String())
	}
	t.Logf("bench all took %s\n%s%s", time.Since(start).Round(time.Second), out.String(), stderr.String())

	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var a bench.All
	if err := json.Unmarshal(data, &a); err != nil {
		t.Fatalf("parsing %s: %v", jsonPath, err)
	}
	if a.Date.IsZero() || time.Since(a.Date) > time.Hour || a.Machine.CPUs <= 0 || a.Machine.MemoryBytes == 0 ||
		a.Machine.Kernel == "" || a.Machine.GoVersion == "" || a.Machine.OS == "" || a.Machine.Arch == "" {
		t.Errorf("date %v, machine %+v: want both filled", a.Date, a.Machine)
	}
	if !a.Quick || a.Target != "embedded control plane" {
		t.Errorf("quick %v, target %q", a.Quick, a.Target)
	}
	if len(a.Skipped) != 3 || a.Skipped["scale"] == "" || a.Skipped["volume"] == "" || a.Skipped["up"] == "" || a.Scale != nil || a.Volume != nil || a.Up != nil {
		t.Errorf("skipped %v (scale %v, volume %v, up %v): want scale, volume and up, and nothing of them", a.Skipped, a.Scale, a.Volume, a.Up)
	}
	for _, name := range []string{"floor", "roundtrip", "webhook", "storage"} {
		if a.Seconds[name] <= 0 {
			t.Errorf("%s: %v s, want its wall time", name, a.Seconds[name])
		}
	}
	// plausible checks that a sample was taken, with its distribution.
	plausible := func(what string, l bench.Latencies) {
		t.Helper()
		if l.N <= 0 || l.P50 <= 0 || l.P99 < l.P50 || l.Max < l.P99 || len(l.Quantiles) != bench.QuantileCount ||
			l.Quantiles[10] != l.P50 || l.Quantiles[20] != l.Max {
			t.Errorf("%s: %+v", what, l)
		}
	}
	if f := a.Floor; f == nil {
		t.Error("no floor")
	} else {
		for _, w := range []int{1, 4} {
			if f.CreatesPerSec[w] <= 0 {
				t.Errorf("floor: %v creates/s with %d writers", f.CreatesPerSec[w], w)
			}
		}
		plausible("floor create→watch", f.CreateToWatch)
		plausible("floor create→status→watch", f.StatusRoundTrip)
	}
	if rt := a.RoundTrip; rt == nil || rt.Floor == nil {
		t.Errorf("roundtrip %+v: want it with its floor", rt)
	} else {
		plausible("ipc.Call", rt.Latency)
		for _, s := range []int{1, 4} {
			if rt.CallsPerSec[s] <= 0 || rt.RequestWritesPerSec[s] <= 0 || rt.ThroughputRatio[s] <= 0 {
				t.Errorf("roundtrip, %d senders: %v Calls/s, %v three writes/s, ratio %v", s, rt.CallsPerSec[s], rt.RequestWritesPerSec[s], rt.ThroughputRatio[s])
			}
		}
		// A Call creates its Book, the receiver writes its status and its Event, and the
		// Call watches the Book: at least that, more only for a retry.
		if r := rt.APIRequests; r == nil || r.Operations != 30 || r.Writes < 3 || r.WritesBy["create books"] < 1 ||
			r.WritesBy["update books/status"] < 1 || r.WritesBy["create events"] < 1 || r.ReadsBy["watch books"] < 1 {
			t.Errorf("roundtrip API requests per Call: %+v", r)
		}
		// In the throughput runs, etcd stores the same three writes for a Call as for the
		// three writes made without ipc, and the API server sends a Call's watchers more
		// events: the receiver's informer and the Call's own watch.
		for _, s := range []int{1, 4} {
			call, writes := rt.CallAPIRequests[s], rt.WritesAPIRequests[s]
			if call == nil || writes == nil || call.EtcdBy["create books"] < 1 || call.EtcdBy["update books"] < 1 || call.EtcdBy["create events"] < 1 ||
				writes.EtcdBy["create books"] < 1 || call.WatchEvents < writes.WatchEvents+2 {
				t.Errorf("roundtrip, %d senders: per Call %+v, per three writes %+v", s, call, writes)
			}
		}
	}
	if w := a.Webhook; w == nil {
		t.Error("no webhook")
	} else {
		plausible("webhook", w.Latency)
		plausible("webhook floor", w.FloorLatency)
		if w.DeliveriesPerSec <= 0 || w.CeilingDeliveriesPerSec <= 0 {
			t.Errorf("webhook: %v deliveries/s, ceiling %v", w.DeliveriesPerSec, w.CeilingDeliveriesPerSec)
		}
		if r := w.APIRequests; r == nil || r.Operations != 60 || r.WritesBy["create pullrequests"] < 1 || r.WritesBy["create events"] < 1 {
			t.Errorf("webhook API requests per delivery: %+v", r)
		}
	}
	if s := a.Storage; s == nil || s.Floor == nil {
		t.Errorf("storage %+v: want it with its floor", s)
	} else {
		plausible("storage create→Ready", s.CreateToReady)
		if s.VolumesPerSec <= 0 || s.IdealVolumesPerSec <= 0 || s.WritesPerVolume <= 0 || s.Pools < int(s.ReplicationFactor) {
			t.Errorf("storage: %v volumes/s (ideal %v), %v writes/volume, %d pools", s.VolumesPerSec, s.IdealVolumesPerSec, s.WritesPerVolume, s.Pools)
		}
		// The volume's create, one per replica, and their status writes at least.
		if r := s.APIRequests; r == nil || r.Operations != 10 || r.WritesBy["create cstorvolumes"] < 1 ||
			r.WritesBy["create cstorvolumereplicas"] < float64(s.ReplicationFactor) || s.WritesPerVolume < float64(s.IdealWrites) {
			t.Errorf("storage API requests per volume: %+v (%v writes to volumes and replicas, ideal %d)", r, s.WritesPerVolume, s.IdealWrites)
		}
		// The three steps of create→Ready, each taking time, adding up to about the whole.
		var sum float64
		for _, st := range s.Steps {
			sum += st.P50Ms
		}
		if len(s.Steps) != 3 || s.Steps[0].P50Ms <= 0 || s.Steps[1].P50Ms <= 0 || s.Steps[2].P50Ms <= 0 {
			t.Errorf("storage steps %+v: want three, each > 0", s.Steps)
		} else if sum < s.CreateToReady.P50/2 {
			t.Errorf("storage steps %+v add up to %v ms, far below create→Ready p50 %v ms", s.Steps, sum, s.CreateToReady.P50)
		}
	}
	// Every goal of the benches that ran, once, each judged.
	want := map[string]int{"roundtrip": 4, "webhook": 2, "storage": 1}
	for _, g := range a.Goals {
		want[g.Bench]--
		if g.Figure == "" || (g.Op != bench.AtMost && g.Op != bench.AtLeast) || g.Goal <= 0 || (g.Met && g.Unmeasured != "") {
			t.Errorf("goal %+v", g)
		}
	}
	for b, n := range want {
		if n != 0 {
			t.Errorf("goals of %s: %d more than wanted (%+v)", b, -n, a.Goals)
		}
	}
	for _, table := range []string{"create→status→watch p50 (ms)", "calls/s, 4 senders", "deliveries/s, 4 clients", "create→Ready p50 (ms)",
		"API writes per call: ", "API writes per delivery: ", "API writes per volume: ", "ipc.Call p50 / floor create→status→watch p50",
		"goals of every bench that ran:", "skipped scale: skipped on request", "skipped volume: skipped on request",
		"skipped up: skipped on request", "wrote " + jsonPath} {
		if !strings.Contains(out.String(), table) {
			t.Errorf("output lacks %q", table)
		}
	}

	// bench plot on that JSON: latency and throughput drawn, the others skipped, saying so.
	plotDir := filepath.Join(dir, "plots")
	cmd = newBenchCommand()
	out.Reset()
	cmd.SetOut(&out)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"plot", "--in", jsonPath, "--out", plotDir})
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("bench plot: %v\n%s", err, out.String())
	}
	for _, name := range []string{"latency.png", "throughput.png"} {
		path := filepath.Join(plotDir, name)
		if !strings.Contains(out.String(), "wrote "+path) {
			t.Errorf("bench plot output lacks %s:\n%s", path, out.String())
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		// Three latency panels (ipc.Call, webhook, storage), two throughput ones.
		if b := img.Bounds(); b.Dx() < 600 || b.Dy() < 2*b.Dx()/3 {
			t.Errorf("%s is %d×%d px", path, b.Dx(), b.Dy())
		}
	}
	for _, name := range []string{"up.png", "scale-memory.png", "scale-latency.png", "volume.png"} {
		if !strings.Contains(out.String(), "skipped "+name+": no ") {
			t.Errorf("bench plot output does not say %s is skipped:\n%s", name, out.String())
		}
		if _, err := os.Stat(filepath.Join(plotDir, name)); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want no file", name, err)
		}
	}
}

// TestBenchPlotRejects: bad input is a clear error, before anything is written.
func TestBenchPlotRejects(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"garbage.json": "not json", "other.json": `{"n": 3}`} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := newBenchCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs([]string{"plot", "--in", path, "--out", filepath.Join(dir, "plots")})
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want an error naming the file", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "plots")); !os.IsNotExist(err) {
		t.Errorf("plots directory: %v, want none", err)
	}
	cmd := newBenchCommand()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"all", "--skip", "flor", "--json", filepath.Join(dir, "r.json")})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), `no bench "flor"`) {
		t.Errorf("bench all --skip flor: %v, want an error naming it", err)
	}
}
