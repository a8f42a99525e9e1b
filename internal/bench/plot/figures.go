package plot

import (
	"fmt"
	"math"
	"slices"

	gplot "gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/crdipc/crdipc/internal/bench"
)

// curve is a latency distribution as (percentile, ms) points: the quantiles up to the
// 95th, then p99 and the maximum, which the quantiles' 5-point steps would jump over.
// Results written before Latencies had quantiles give p50, p99 and max alone.
func curve(l bench.Latencies) plotter.XYs {
	if l.N == 0 {
		return nil
	}
	var xys plotter.XYs
	if len(l.Quantiles) == bench.QuantileCount {
		for i, q := range l.Quantiles[:len(l.Quantiles)-1] {
			xys = append(xys, plotter.XY{X: bench.QuantilePercent(i), Y: q})
		}
	} else {
		xys = append(xys, plotter.XY{X: 50, Y: l.P50})
	}
	xys = append(xys, plotter.XY{X: 99, Y: l.P99}, plotter.XY{X: 100, Y: l.Max})
	for i := range xys {
		// A log axis has no 0; ms has a resolution of 1 µs.
		xys[i].Y = max(xys[i].Y, 0.001)
	}
	return xys
}

// latencyPanel draws distributions against percentiles, on a log axis of ms.
type latencyPanel struct {
	p  *gplot.Plot
	ys []float64
	n  int
}

func newLatencyPanel(title string) *latencyPanel {
	p := newPanel(title, "percentile (%; past the 90th stretched, where the tail is)", "latency (ms, log scale)")
	p.X.Min, p.X.Max = 0, 100
	p.X.Scale = tailScale{}
	p.X.Tick.Marker = gplot.ConstantTicks{{Value: 0, Label: "0"}, {Value: 25, Label: "25"}, {Value: 50, Label: "50"},
		{Value: 75, Label: "75"}, {Value: 90, Label: "90"}, {Value: 95, Label: "95"}, {Value: 99, Label: "99"}, {Value: 100, Label: "max"}}
	return &latencyPanel{p: p}
}

// tailScale is a percentile axis that gives the tail room: 0–90 take 70% of the width,
// 90–99 20%, 99–max 10%.
type tailScale struct{}

func (tailScale) Normalize(lo, hi, x float64) float64 {
	f := func(x float64) float64 {
		switch {
		case x <= 90:
			return x / 90 * 0.7
		case x <= 99:
			return 0.7 + (x-90)/9*0.2
		default:
			return 0.9 + (x-99)*0.1
		}
	}
	return (f(x) - f(lo)) / (f(hi) - f(lo))
}

func (lp *latencyPanel) add(name string, l bench.Latencies) error {
	xys := curve(l)
	if xys == nil {
		return nil
	}
	if err := series(lp.p, fmt.Sprintf("%s (n=%d)", name, l.N), lp.n, xys); err != nil {
		return err
	}
	lp.n++
	for _, xy := range xys {
		lp.ys = append(lp.ys, xy.Y)
	}
	return nil
}

// goals marks goal points (percentile, ms).
func (lp *latencyPanel) goals(name string, xys plotter.XYs) error {
	s, err := plotter.NewScatter(xys)
	if err != nil {
		return err
	}
	s.Color, s.Shape, s.Radius = goalColor, goalGlyph{}, vg.Points(7)
	lp.p.Add(s)
	lp.p.Legend.Add(name, s)
	for _, xy := range xys {
		lp.ys = append(lp.ys, xy.Y)
	}
	return nil
}

func (lp *latencyPanel) line(name string, ms float64) error {
	if ms <= 0 {
		return nil
	}
	lp.ys = append(lp.ys, ms)
	return goalLine(lp.p, name, ms, 0, 100, neutralColor)
}

func (lp *latencyPanel) done() (*gplot.Plot, error) {
	if lp.n == 0 {
		return nil, nil
	}
	lo, hi, _ := minMax(lp.ys...)
	return lp.p, logAxis(&lp.p.Y, lo, hi*2.5) // the legend's room above the data
}

// latency: ipc.Call, the webhook listener and CStorVolumes, each against its floor.
func latency(a *bench.All) (*figure, string, error) {
	var f figure
	floor := a.Floor
	if a.RoundTrip != nil && a.RoundTrip.Floor != nil {
		floor = a.RoundTrip.Floor // measured next to the Calls
	}
	if a.RoundTrip != nil || floor != nil {
		lp := newLatencyPanel("ipc.Call round trip against the API server floor (one sender, one request at a time)")
		if rt := a.RoundTrip; rt != nil {
			if err := lp.add("ipc.Call: create → receiver → status → watch", rt.Latency); err != nil {
				return nil, "", err
			}
		}
		if floor != nil {
			if err := lp.add("floor: create → another client writes status → watch", floor.StatusRoundTrip); err != nil {
				return nil, "", err
			}
			if err := lp.add("floor: create → watch", floor.CreateToWatch); err != nil {
				return nil, "", err
			}
			if a.RoundTrip != nil && floor.StatusRoundTrip.N > 0 {
				if err := lp.goals(fmt.Sprintf("goal: p50 ≤ %g×, p99 ≤ %g× the floor's create → status → watch", bench.RoundTripP50Goal, bench.RoundTripP99Goal), plotter.XYs{
					{X: 50, Y: bench.RoundTripP50Goal * floor.StatusRoundTrip.P50}, {X: 99, Y: bench.RoundTripP99Goal * floor.StatusRoundTrip.P99}}); err != nil {
					return nil, "", err
				}
			}
		}
		p, err := lp.done()
		if err != nil {
			return nil, "", err
		}
		f.add(p)
	}
	if w := a.Webhook; w != nil {
		lp := newLatencyPanel(fmt.Sprintf("GitHub webhook delivery at %.0f/s against the same three writes sent straight to the API server", w.Options.Rate))
		if err := lp.add("listener: request → 2xx", w.Latency); err != nil {
			return nil, "", err
		}
		if err := lp.add("floor: PullRequest, Event, Delivery (complete)", w.FloorLatency); err != nil {
			return nil, "", err
		}
		if w.FloorLatency.N > 0 {
			if err := lp.goals(fmt.Sprintf("goal: p99 ≤ %g× the same writes sent straight", bench.WebhookP99Goal), plotter.XYs{{X: 99, Y: bench.WebhookP99Goal * w.FloorLatency.P99}}); err != nil {
				return nil, "", err
			}
		}
		p, err := lp.done()
		if err != nil {
			return nil, "", err
		}
		f.add(p)
	}
	if s := a.Storage; s != nil {
		lp := newLatencyPanel(fmt.Sprintf("CStorVolume create → Ready (RF %d, volumes one at a time) against its ideal", s.ReplicationFactor))
		if err := lp.add("create → Ready", s.CreateToReady); err != nil {
			return nil, "", err
		}
		if s.Floor != nil {
			if err := lp.add("floor: create → watch", s.Floor.CreateToWatch); err != nil {
				return nil, "", err
			}
		}
		if err := lp.line(fmt.Sprintf("ideal: four writes in a row at the floor's create → watch p50 (%.1f ms)", s.IdealLatencyMs), s.IdealLatencyMs); err != nil {
			return nil, "", err
		}
		p, err := lp.done()
		if err != nil {
			return nil, "", err
		}
		f.add(p)
	}
	if len(f.panels) == 0 {
		return nil, "no roundtrip, floor, webhook or storage results", nil
	}
	return &f, "", nil
}

func (f *figure) add(p *gplot.Plot) {
	if p != nil {
		f.panels = append(f.panels, p)
	}
}

// throughput: Calls/s next to the floor's ceiling and the same writes without ipc; the
// webhook's and storage's rates as shares of their ceilings.
func throughput(a *bench.All) (*figure, string, error) {
	var f figure
	if rt := a.RoundTrip; rt != nil && len(rt.CallsPerSec) > 0 {
		senders := make([]int, 0, len(rt.CallsPerSec))
		for s := range rt.CallsPerSec {
			senders = append(senders, s)
		}
		slices.Sort(senders)
		names := make([]string, len(senders))
		var ceiling, calls, writes, goal []float64
		var goals plotter.XYs
		for i, s := range senders {
			names[i] = fmt.Sprintf("%d senders", s)
			if s == 1 {
				names[i] = "1 sender"
			}
			c := 0.0
			if rt.Floor != nil {
				c = rt.Floor.CreatesPerSec[s] / 3
			}
			ceiling = append(ceiling, c)
			calls = append(calls, rt.CallsPerSec[s])
			writes = append(writes, rt.RequestWritesPerSec[s])
			// The goal is against the same writes without ipc, at the sender counts it is about.
			g := 0.0
			if slices.Contains(bench.RoundTripGoalSenders, s) {
				g = bench.RoundTripWritesGoal * rt.RequestWritesPerSec[s]
			}
			goal = append(goal, g)
			if g > 0 {
				goals = append(goals, plotter.XY{X: float64(i), Y: g})
			}
		}
		p := newBarPanel("ipc.Call throughput against the API server's ceiling", "requests per second", names...)
		// ipc.Call in the middle of each group, where its goal mark sits.
		if err := bars(p, "ceiling: the floor's creates/s ÷ 3 (a request is three writes)", 0, 3, ceilingColor, ceiling, labels(ceiling)); err != nil {
			return nil, "", err
		}
		if err := bars(p, "ipc.Call: Calls/s", 1, 3, plotutil.Color(2), calls, labels(calls), goal...); err != nil {
			return nil, "", err
		}
		if err := bars(p, "the same three writes without ipc (create, status, Event)", 2, 3, plotutil.Color(1), writes, labels(writes)); err != nil {
			return nil, "", err
		}
		if len(goals) > 0 {
			if err := goalMarks(p, fmt.Sprintf("goal: Calls/s ≥ %g × the three writes without ipc", bench.RoundTripWritesGoal), goals); err != nil {
				return nil, "", err
			}
		}
		p.Y.Max = 1.5 * max(slices.Max(ceiling), slices.Max(calls), slices.Max(writes)) // room for the legend
		f.add(p)
	}
	var names, texts []string
	var shares, goalAt plotter.Values
	var goals plotter.XYs
	if w := a.Webhook; w != nil && w.CeilingDeliveriesPerSec > 0 {
		names = append(names, fmt.Sprintf("webhook deliveries, %d clients", w.Options.Clients))
		shares = append(shares, w.DeliveriesPerSec/w.CeilingDeliveriesPerSec)
		texts = append(texts, fmt.Sprintf("%.2f: %.0f of %.0f/s", w.DeliveriesPerSec/w.CeilingDeliveriesPerSec, w.DeliveriesPerSec, w.CeilingDeliveriesPerSec))
		goals = append(goals, plotter.XY{X: float64(len(names) - 1), Y: bench.WebhookThroughputGoal})
		goalAt = append(goalAt, bench.WebhookThroughputGoal)
	}
	if s := a.Storage; s != nil && s.IdealVolumesPerSec > 0 {
		names = append(names, fmt.Sprintf("CStorVolumes Ready, %d creators", s.Creators))
		shares = append(shares, s.VolumesPerSec/s.IdealVolumesPerSec)
		texts = append(texts, fmt.Sprintf("%.2f: %.1f of %.1f/s", s.VolumesPerSec/s.IdealVolumesPerSec, s.VolumesPerSec, s.IdealVolumesPerSec))
		goalAt = append(goalAt, 0)
	}
	if len(names) > 0 {
		p := newBarPanel("Webhook and storage throughput as a share of the ceiling the floor allows", "measured / ceiling", names...)
		if err := bars(p, "share of the ceiling (the floor's creates/s ÷ the writes each needs)", 0, 1, plotutil.Color(2), shares, texts, goalAt...); err != nil {
			return nil, "", err
		}
		if len(goals) > 0 {
			if err := goalMarks(p, fmt.Sprintf("goal: webhook ≥ %g", bench.WebhookThroughputGoal), goals); err != nil {
				return nil, "", err
			}
		}
		if err := goalLine(p, "= ceiling", 1, -0.5, float64(len(names))-0.5, neutralColor); err != nil {
			return nil, "", err
		}
		p.Y.Max = 1.7 * max(1, slices.Max(shares))
		f.add(p)
	}
	if len(f.panels) == 0 {
		return nil, "no roundtrip, webhook or storage results", nil
	}
	return &f, "", nil
}

func labels(vs plotter.Values) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = number(math.Round(v))
	}
	return out
}

// goalMarks adds goal crosses at xys.
func goalMarks(p *gplot.Plot, name string, xys plotter.XYs) error {
	s, err := plotter.NewScatter(xys)
	if err != nil {
		return err
	}
	s.Color, s.Shape, s.Radius = goalColor, goalGlyph{}, vg.Points(10)
	p.Add(s)
	p.Legend.Add(name, s)
	return nil
}

// bookAxis is the log axis of the Book populations, a tick at each.
func bookAxis(p *gplot.Plot, steps []bench.ScaleStep) error {
	var ticks gplot.ConstantTicks
	var books []float64
	for _, st := range steps {
		books = append(books, float64(st.Books))
		ticks = append(ticks, gplot.Tick{Value: float64(st.Books), Label: count(st.Books)})
	}
	lo, hi, ok := minMax(books...)
	if !ok {
		return fmt.Errorf("scale steps without Books: %v", books)
	}
	if err := logAxis(&p.X, lo, hi); err != nil {
		return err
	}
	p.X.Tick.Marker = ticks
	return nil
}

// stepSeries is a figure of every step, skipping values a log axis cannot show.
func stepSeries(steps []bench.ScaleStep, v func(bench.ScaleStep) float64, positive bool) plotter.XYs {
	var xys plotter.XYs
	for _, st := range steps {
		if y := v(st); !positive || y > 0 {
			xys = append(xys, plotter.XY{X: float64(st.Books), Y: y})
		}
	}
	return xys
}

func ys(series ...plotter.XYs) []float64 {
	var out []float64
	for _, s := range series {
		for _, xy := range s {
			out = append(out, xy.Y)
		}
	}
	return out
}

const mib = 1 << 20

// scaleMemory: the process's memory, and memory per Book, against the population.
func scaleMemory(a *bench.All) (*figure, string, error) {
	s := a.Scale
	if s == nil || len(s.Steps) == 0 {
		return nil, "no scale results", nil
	}
	who := "This process (control plane + Book receiver, as in up)"
	if !s.InProcess {
		who = "The bench process (the cluster runs elsewhere)"
	}
	p := newPanel(who+": memory against Books", "Books in the cluster (log scale)", "memory (MiB)")
	rss := stepSeries(s.Steps, func(st bench.ScaleStep) float64 { return float64(st.Memory.RSSBytes) / mib }, false)
	released := stepSeries(s.Steps, func(st bench.ScaleStep) float64 { return float64(st.Memory.ReleasedRSSBytes) / mib }, false)
	heap := stepSeries(s.Steps, func(st bench.ScaleStep) float64 { return float64(st.Memory.HeapBytes) / mib }, false)
	for i, sr := range []struct {
		name string
		xys  plotter.XYs
	}{{"RSS", rss}, {"RSS, free pages released to the OS", released}, {"live Go heap", heap}} {
		if err := series(p, sr.name, i, sr.xys); err != nil {
			return nil, "", err
		}
	}
	if err := bookAxis(p, s.Steps); err != nil {
		return nil, "", err
	}
	top := slices.Max(ys(rss, released, heap))
	if s.InProcess && s.RSSGoalBytes > 0 {
		goal := float64(s.RSSGoalBytes) / mib
		if err := goalLine(p, fmt.Sprintf("goal: RSS < %.0f GiB at %s Books", goal/1024, count(bench.ScaleRSSGoalSize)), goal, p.X.Min, p.X.Max, goalColor); err != nil {
			return nil, "", err
		}
		top = max(top, goal)
	}
	p.Y.Min, p.Y.Max = 0, 1.35*top

	title := "Memory per Book against Books"
	for _, st := range s.Steps {
		if st.RSSPerBook <= 0 || st.HeapPerBook <= 0 || st.CacheBytesPer <= 0 {
			title += " (values ≤ 0, at or below the baseline, left out)"
			break
		}
	}
	q := newPanel(title, "Books in the cluster (log scale)", "bytes per Book (log scale)")
	rssPer := stepSeries(s.Steps, func(st bench.ScaleStep) float64 { return st.RSSPerBook }, true)
	heapPer := stepSeries(s.Steps, func(st bench.ScaleStep) float64 { return st.HeapPerBook }, true)
	cached := stepSeries(s.Steps, func(st bench.ScaleStep) float64 { return st.CacheBytesPer }, true)
	for i, sr := range []struct {
		name string
		xys  plotter.XYs
	}{{"RSS per Book, over the baseline", rssPer}, {"live heap per Book, over the baseline", heapPer}, {"heap per Book in a fresh controller-runtime cache", cached}} {
		if err := series(q, sr.name, i, sr.xys); err != nil {
			return nil, "", err
		}
	}
	if err := bookAxis(q, s.Steps); err != nil {
		return nil, "", err
	}
	if s.CacheBytesGoal > 0 {
		if err := goalLine(q, fmt.Sprintf("goal: ≤ %.0f bytes per cached Book", s.CacheBytesGoal), s.CacheBytesGoal, q.X.Min, q.X.Max, goalColor); err != nil {
			return nil, "", err
		}
	}
	lo, hi, ok := minMax(append(ys(rssPer, heapPer, cached), s.CacheBytesGoal)...)
	if !ok {
		return &figure{panels: []*gplot.Plot{p}}, "", nil
	}
	if err := logAxis(&q.Y, lo, hi*8); err != nil { // the legend's room above the data
		return nil, "", err
	}
	return &figure{panels: []*gplot.Plot{p, q}}, "", nil
}

// scaleLatency: ipc.Call, lists and cache syncs against the population.
func scaleLatency(a *bench.All) (*figure, string, error) {
	s := a.Scale
	if s == nil || len(s.Steps) == 0 {
		return nil, "no scale results", nil
	}
	p := newPanel("ipc.Call latency against Books (sequential Calls of a new Book)", "Books in the cluster (log scale)", "latency (ms, log scale)")
	p50 := stepSeries(s.Steps, func(st bench.ScaleStep) float64 { return st.Call.P50 }, true)
	p99 := stepSeries(s.Steps, func(st bench.ScaleStep) float64 { return st.Call.P99 }, true)
	if err := series(p, "p50", 0, p50); err != nil {
		return nil, "", err
	}
	if err := series(p, "p99", 1, p99); err != nil {
		return nil, "", err
	}
	if err := bookAxis(p, s.Steps); err != nil {
		return nil, "", err
	}
	all := ys(p50, p99)
	if first := s.Steps[0].Call.P50; first > 0 && s.CallRatioGoal > 0 {
		goal := s.CallRatioGoal * first
		if err := goalLine(p, fmt.Sprintf("goal: p50 ≤ %.1f × the p50 at %s Books", s.CallRatioGoal, count(s.Steps[0].Books)), goal, p.X.Min, p.X.Max, goalColor); err != nil {
			return nil, "", err
		}
		all = append(all, goal)
	}
	lo, hi, ok := minMax(all...)
	if !ok {
		return nil, "no ipc.Call succeeded at any scale step", nil
	}
	if err := logAxis(&p.Y, lo, hi*4); err != nil {
		return nil, "", err
	}
	f := &figure{panels: []*gplot.Plot{p}}

	q := newPanel("Listing and caching every Book against Books", "Books in the cluster (log scale)", "ms (log scale)")
	list := stepSeries(s.Steps, func(st bench.ScaleStep) float64 { return st.ListMs }, true)
	paged := stepSeries(s.Steps, func(st bench.ScaleStep) float64 { return st.PagedListMs }, true)
	sync := stepSeries(s.Steps, func(st bench.ScaleStep) float64 { return st.CacheSyncMs }, true)
	limit := s.Steps[0].PagedListLimit
	for i, sr := range []struct {
		name string
		xys  plotter.XYs
	}{{"full List", list}, {fmt.Sprintf("List in pages of %d", limit), paged}, {"fresh cache: list and sync", sync}} {
		if err := series(q, sr.name, i, sr.xys); err != nil {
			return nil, "", err
		}
	}
	if lo, hi, ok := minMax(ys(list, paged, sync)...); ok {
		if err := bookAxis(q, s.Steps); err != nil {
			return nil, "", err
		}
		if err := logAxis(&q.Y, lo, hi*8); err != nil {
			return nil, "", err
		}
		f.add(q)
	}
	return f, "", nil
}

// volume: each fio job's volume/local ratio against its goal, and the rebuild's rate.
func volume(a *bench.All) (*figure, string, error) {
	v := a.Volume
	if v == nil || len(v.Jobs) == 0 {
		return nil, "no volume results", nil
	}
	var ratios, goalAt plotter.Values
	var names, texts []string
	var goals plotter.XYs
	for i, j := range v.Jobs {
		value := func(r bench.FioResult) string {
			if j.Metric == "IOPS" {
				return fmt.Sprintf("%.0f", r.IOPS)
			}
			return fmt.Sprintf("%.0f", r.MiBPerSec)
		}
		names = append(names, fmt.Sprintf("%s\n%s vs %s %s", jobName(j.Name), value(j.Volume), value(j.Local), j.Metric))
		ratios = append(ratios, j.Ratio)
		texts = append(texts, fmt.Sprintf("%.2f", j.Ratio))
		// The goal is about the local file ÷ Divisor (the replicas sharing its disk); on
		// this axis, volume / local file, it is Goal / Divisor. Results written before
		// Divisor existed have none: 1.
		goal := j.Goal / float64(max(j.Divisor, 1))
		if goal > 0 {
			goals = append(goals, plotter.XY{X: float64(i), Y: goal})
		}
		goalAt = append(goalAt, goal)
	}
	p := newBarPanel(fmt.Sprintf("Replicated volume (RF %d, %s, fio %s) against a local file on the same disk", v.ReplicationFactor, v.FsType, v.Engine),
		"volume / local file", names...)
	if err := bars(p, "volume / local file", 0, 1, plotutil.Color(2), ratios, texts, goalAt...); err != nil {
		return nil, "", err
	}
	if len(goals) > 0 {
		if err := goalMarks(p, "goal (a write's is of the local file ÷ the replicas, drawn here ÷ them)", goals); err != nil {
			return nil, "", err
		}
	}
	if err := goalLine(p, "= local file", 1, -0.5, float64(len(names))-0.5, neutralColor); err != nil {
		return nil, "", err
	}
	p.Y.Max = 1.7 * max(1, slices.Max(ratios))
	f := &figure{panels: []*gplot.Plot{p}}

	if r := v.Rebuild; r.MiBPerSec > 0 {
		name := fmt.Sprintf("%.0f MiB allocated of %.0f MiB, in %.3g s", float64(r.AllocatedBytes)/mib, float64(r.VolumeBytes)/mib, r.Seconds)
		q := newBarPanel("Replica rebuild over the data path (one replica copied from another)", "MiB/s", name)
		if err := bars(q, "rebuild", 0, 1, plotutil.Color(2), plotter.Values{r.MiBPerSec}, []string{fmt.Sprintf("%.0f MiB/s", r.MiBPerSec)}); err != nil {
			return nil, "", err
		}
		if r.Goal > 0 {
			if err := goalLine(q, fmt.Sprintf("goal: ≥ %.0f MiB/s", r.Goal), r.Goal, -0.5, 0.5, goalColor); err != nil {
				return nil, "", err
			}
		}
		q.Y.Max = 1.7 * max(r.MiBPerSec, r.Goal)
		f.add(q)
	}
	return f, "", nil
}

// jobName is a fio job's name in words.
func jobName(n string) string {
	switch n {
	case "seqWrite":
		return "sequential write"
	case "seqRead":
		return "sequential read"
	case "randWrite":
		return "random 4 KiB write"
	}
	return n
}

// upStarts draws `crdipc up`'s starts (bench up): one bar per start, stacked from its
// phases in the order up ran them, its total above it, against the goal.
func upStarts(a *bench.All) (*figure, string, error) {
	u := a.Up
	if u == nil || len(u.Starts) == 0 {
		return nil, "no up results", nil
	}
	var names []string
	var totals plotter.Values
	for i, s := range u.Starts {
		names = append(names, fmt.Sprintf("start %d", i+1))
		totals = append(totals, s.Seconds)
	}
	phases := u.PhaseNames()
	p := newBarPanel(fmt.Sprintf("crdipc up from a fresh data dir: %d starts, median %.2f s", len(u.Starts), u.MedianSeconds), "seconds", names...)
	// Phases stacked bottom up; the legend lists them top down, as they appear.
	const barWidth = 34
	var below *plotter.BarChart
	var charts []*plotter.BarChart
	for i, name := range phases {
		vs := make(plotter.Values, len(u.Starts))
		for j, s := range u.Starts {
			ms, _ := s.PhaseMs(name)
			vs[j] = ms / 1000
		}
		b, err := plotter.NewBarChart(vs, vg.Points(barWidth))
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", name, err)
		}
		b.Color, b.LineStyle.Width = plotutil.Color(i), 0
		if below != nil {
			b.StackOn(below)
		}
		below = b
		charts = append(charts, b)
		p.Add(b)
	}
	for i := len(charts) - 1; i >= 0; i-- {
		p.Legend.Add(phases[i], charts[i])
	}
	xys := make(plotter.XYs, len(totals))
	texts := make([]string, len(totals))
	for i, v := range totals {
		xys[i], texts[i] = plotter.XY{X: float64(i), Y: v}, fmt.Sprintf("%.2f s", v)
	}
	l, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
	if err != nil {
		return nil, "", err
	}
	for i := range l.TextStyle {
		l.TextStyle[i].Font.Size = vg.Points(8)
		l.TextStyle[i].XAlign = draw.XCenter
	}
	l.Offset = vg.Point{Y: vg.Points(4)}
	p.Add(l)
	if err := goalLine(p, fmt.Sprintf("goal: ≤ %.1f s", u.GoalSeconds), u.GoalSeconds, -0.5, float64(len(names))-0.5, goalColor); err != nil {
		return nil, "", err
	}
	p.Y.Max = 1.5 * max(u.GoalSeconds, slices.Max(totals))
	p.Legend.Left = false
	return &figure{panels: []*gplot.Plot{p}}, "", nil
}
