package plot

import (
	"encoding/json"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gonum.org/v1/plot/vg"

	"github.com/crdipc/crdipc/internal/bench"
)

func readFixture(t *testing.T) *bench.All {
	t.Helper()
	data, err := os.ReadFile("testdata/all.json")
	if err != nil {
		t.Fatal(err)
	}
	var a bench.All
	if err := json.Unmarshal(data, &a); err != nil {
		t.Fatalf("testdata/all.json: %v", err)
	}
	return &a
}

// checkPNG decodes path and checks it is one panel wide and high enough for panels.
func checkPNG(t *testing.T, path string, minPanels int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	w, h := img.Bounds().Dx(), img.Bounds().Dy()
	px := func(l vg.Length) int { return int(l/vg.Inch*dpi + 0.5) }
	if w != px(width) || h < minPanels*px(panelHeight)-1 || w < 600 {
		t.Errorf("%s is %d×%d px, want %d px wide and at least %d panels of %d px", path, w, h, px(width), minPanels, px(panelHeight))
	}
}

// TestDraw draws every figure from a hand-written result with every section, one of them
// (scale) in the format written before Latencies had quantiles.
func TestDraw(t *testing.T) {
	a := readFixture(t)
	dir := t.TempDir()
	results, err := Draw(a, dir)
	if err != nil {
		t.Fatal(err)
	}
	panels := map[string]int{"up.png": 1, "latency.png": 3, "throughput.png": 2, "scale-memory.png": 2, "scale-latency.png": 2, "volume.png": 2}
	if len(results) != len(Files) {
		t.Fatalf("results %+v, want one per file of %v", results, Files)
	}
	for _, r := range results {
		if r.Skipped != "" || r.Path != filepath.Join(dir, r.File) {
			t.Errorf("%s: skipped %q, path %q; want it written in %s", r.File, r.Skipped, r.Path, dir)
			continue
		}
		checkPNG(t, r.Path, panels[r.File])
	}
	// Written whole: nothing else in the directory, no temporary file left.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	want := slices.Clone(Files)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("directory holds %v, want %v", names, want)
	}
}

// TestDrawSkips: a figure whose data is absent is skipped with the reason, the others drawn.
func TestDrawSkips(t *testing.T) {
	a := readFixture(t)
	a.Up, a.RoundTrip, a.Webhook, a.Storage, a.Scale, a.Volume = nil, nil, nil, nil, nil, nil
	dir := t.TempDir()
	results, err := Draw(a, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		switch r.File {
		case "latency.png": // the floor alone
			if r.Path == "" {
				t.Errorf("latency.png skipped (%s), want the floor's panel", r.Skipped)
				continue
			}
			checkPNG(t, r.Path, 1)
		default:
			if r.Path != "" || !strings.HasPrefix(r.Skipped, "no ") {
				t.Errorf("%s: path %q, skipped %q; want it skipped, saying what is missing", r.File, r.Path, r.Skipped)
			}
			if _, err := os.Stat(filepath.Join(dir, r.File)); !os.IsNotExist(err) {
				t.Errorf("%s: %v, want no file", r.File, err)
			}
		}
	}
}

// TestCurve: the quantiles up to p95, then p99 and the maximum; p50, p99 and max alone for
// results without quantiles; a log axis gets no zero.
func TestCurve(t *testing.T) {
	q := make([]float64, bench.QuantileCount)
	for i := range q {
		q[i] = float64(i)
	}
	c := curve(bench.Latencies{N: 100, P50: 10, P99: 19.5, Max: 20, Quantiles: q})
	if len(c) != bench.QuantileCount+1 || c[0].Y != 0.001 || c[19].X != 95 || c[20].X != 99 || c[20].Y != 19.5 || c[21].X != 100 || c[21].Y != 20 {
		t.Errorf("curve %v", c)
	}
	c = curve(bench.Latencies{N: 3, P50: 1, P99: 2, Max: 3})
	if len(c) != 3 || c[0].X != 50 || c[1].X != 99 || c[2].Y != 3 {
		t.Errorf("curve without quantiles %v", c)
	}
	if c := curve(bench.Latencies{}); c != nil {
		t.Errorf("curve of nothing %v", c)
	}
}
