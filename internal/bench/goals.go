package bench

import (
	"fmt"
	"math"
	"strconv"
)

// Goal is one goal of a bench: a figure of the run — mostly a ratio to a floor measured in
// the same run, so that it holds on a machine whose absolute speed drifts — against the
// value the issue asks for. Every bench's table, its JSON and bench all's summary come from
// the bench's Goals(), so that a goal is defined once.
type Goal struct {
	Bench  string `json:"bench"`
	Figure string `json:"figure"`
	// Value is the figure measured; 0 when Unmeasured says why there is none.
	Value float64 `json:"value"`
	// Op compares Value with Goal: AtMost, AtLeast or Below.
	Op   string  `json:"op"`
	Goal float64 `json:"goal"`
	// Unit of Value and Goal: Ratio, or that of an absolute figure (s, MiB/s, bytes, MiB).
	Unit string `json:"unit"`
	Met  bool   `json:"met"`
	// Unmeasured says why there is no figure to judge (a floor of 0, a size the run did not
	// reach); such a goal is missed, never met by default.
	Unmeasured string `json:"unmeasured,omitempty"`
}

// Operators of Goal.Op.
const (
	AtMost  = "≤"
	AtLeast = "≥"
	Below   = "<"
)

// Ratio is the Unit of a figure that is one measurement over another.
const Ratio = "×"

// goalTolerance lets a figure equal to its goal but for the last bits of floating point
// (1.2 computed as 7.2/6) meet it: what prints as the goal meets it.
const goalTolerance = 1e-9

// ratioGoal is the goal that num/den compares op goal. A ratio needs both measurements:
// with either zero, negative or not a number, the goal is unmeasured, hence missed.
func ratioGoal(bench, figure string, num, den float64, op string, goal float64) Goal {
	g := Goal{Bench: bench, Figure: figure, Op: op, Goal: goal, Unit: Ratio}
	switch {
	case math.IsNaN(den) || math.IsInf(den, 0):
		return g.unmeasured("the floor is not a number")
	case den <= 0:
		return g.unmeasured("the floor is 0")
	case math.IsNaN(num) || math.IsInf(num, 0):
		return g.unmeasured("the figure is not a number")
	case num <= 0:
		return g.unmeasured("the figure is 0")
	}
	return g.judge(num / den)
}

// absoluteGoal is the goal that value, in unit, compares op goal; a value that is not a
// number is unmeasured.
func absoluteGoal(bench, figure string, value float64, op string, goal float64, unit string) Goal {
	g := Goal{Bench: bench, Figure: figure, Op: op, Goal: goal, Unit: unit}
	if math.IsNaN(value) || math.IsInf(value, 0) {
		return g.unmeasured("the figure is not a number")
	}
	return g.judge(value)
}

// unmeasuredGoal is a goal the run has no figure for, and why.
func unmeasuredGoal(bench, figure, op string, goal float64, unit, why string) Goal {
	return Goal{Bench: bench, Figure: figure, Op: op, Goal: goal, Unit: unit}.unmeasured(why)
}

func (g Goal) unmeasured(why string) Goal {
	g.Value, g.Met, g.Unmeasured = 0, false, why
	return g
}

func (g Goal) judge(v float64) Goal {
	g.Value = v
	slack := goalTolerance * math.Abs(g.Goal)
	switch g.Op {
	case AtMost:
		g.Met = v <= g.Goal+slack
	case AtLeast:
		g.Met = v >= g.Goal-slack
	case Below:
		g.Met = v < g.Goal
	default:
		return g.unmeasured(fmt.Sprintf("no such comparison %q", g.Op))
	}
	return g
}

// Verdict is "met", "missed", or "missed (why)" for a goal without a figure.
func (g Goal) Verdict() string {
	switch {
	case g.Met:
		return "met"
	case g.Unmeasured != "":
		return "missed (" + g.Unmeasured + ")"
	default:
		return "missed"
	}
}

// ValueText is Value with its unit, "-" when unmeasured.
func (g Goal) ValueText() string {
	if g.Unmeasured != "" {
		return "-"
	}
	return formatFigure(g.Value, g.Unit)
}

// GoalText is the goal with its operator and unit, as the issue writes it: "≤ 1.2×",
// "≥ 100 MiB/s".
func (g Goal) GoalText() string {
	v := strconv.FormatFloat(g.Goal, 'f', -1, 64)
	if g.Unit == Ratio {
		return g.Op + " " + v + Ratio
	}
	return g.Op + " " + v + " " + g.Unit
}

func formatFigure(v float64, unit string) string {
	switch {
	case unit == Ratio:
		return fmt.Sprintf("%.2f%s", v, Ratio)
	case v == math.Trunc(v) || math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f %s", v, unit)
	default:
		return fmt.Sprintf("%.2f %s", v, unit)
	}
}

// Goals of the benches, from the issues that set them (issue 30 for the ratios).
const (
	// RoundTripP50Goal and RoundTripP99Goal: ipc.Call over the floor's create→status→watch.
	RoundTripP50Goal = 1.2
	RoundTripP99Goal = 1.5
	// RoundTripWritesGoal: Calls/s over the same three writes made without ipc, at each of
	// RoundTripGoalSenders.
	RoundTripWritesGoal = 0.9
	// WebhookThroughputGoal: deliveries/s over the ceiling the floor allows for its writes.
	WebhookThroughputGoal = 0.8
	// WebhookP99Goal: the listener's p99 at the paced rate over the same writes made
	// straight to the API server at that rate.
	WebhookP99Goal = 1.5
	// StorageP50Goal: create→Ready p50 over its ideal.
	StorageP50Goal = 2
)

// RoundTripGoalSenders are the sender counts the throughput goal is about.
var RoundTripGoalSenders = []int{8, 32}

// Goals of one ipc.Call round trip: latency against the floor, throughput against the same
// writes without ipc (the floor's creates/s ÷ 3 is printed too, but is no goal: a status
// update costs the API server more than a create, so no receiver could reach it).
func (rt *RoundTrip) Goals() []Goal {
	floor := rt.Floor
	if floor == nil {
		floor = &Floor{}
	}
	goals := []Goal{
		ratioGoal(NameRoundTrip, "ipc.Call p50 / floor create→status→watch p50", rt.Latency.P50, floor.StatusRoundTrip.P50, AtMost, RoundTripP50Goal),
		ratioGoal(NameRoundTrip, "ipc.Call p99 / floor create→status→watch p99", rt.Latency.P99, floor.StatusRoundTrip.P99, AtMost, RoundTripP99Goal),
	}
	for _, s := range RoundTripGoalSenders {
		figure := fmt.Sprintf("calls/s, %d senders / the three writes without ipc", s)
		if _, ok := rt.CallsPerSec[s]; !ok {
			goals = append(goals, unmeasuredGoal(NameRoundTrip, figure, AtLeast, RoundTripWritesGoal, Ratio, fmt.Sprintf("not run with %d senders", s)))
			continue
		}
		goals = append(goals, ratioGoal(NameRoundTrip, figure, rt.CallsPerSec[s], rt.RequestWritesPerSec[s], AtLeast, RoundTripWritesGoal))
	}
	return goals
}

// Goals of the webhook listener: throughput against the ceiling for its writes, p99
// against the same writes made straight.
func (w *Webhook) Goals() []Goal {
	return []Goal{
		ratioGoal(NameWebhook, fmt.Sprintf("deliveries/s, %d clients / ceiling for its writes", w.Options.Clients), w.DeliveriesPerSec, w.CeilingDeliveriesPerSec, AtLeast, WebhookThroughputGoal),
		ratioGoal(NameWebhook, fmt.Sprintf("p99 at %.0f/s / the same writes made straight", w.Options.Rate), w.Latency.P99, w.FloorLatency.P99, AtMost, WebhookP99Goal),
	}
}

// Goals of the storage bench: create→Ready against its ideal.
func (s *Storage) Goals() []Goal {
	return []Goal{
		ratioGoal(NameStorage, "create→Ready p50 / ideal (4 × floor create→watch p50)", s.CreateToReady.P50, s.IdealLatencyMs, AtMost, StorageP50Goal),
	}
}

// goal is the goal of job j, if it has one: its volume figure over the local file's
// divided by Divisor.
func (j FioRatio) goal() (Goal, bool) {
	if j.Goal <= 0 {
		return Goal{}, false
	}
	figure := fmt.Sprintf("%s / local file", jobFigure(j))
	if j.Divisor > 1 {
		figure = fmt.Sprintf("%s / (local file ÷ %d replicas)", jobFigure(j), j.Divisor)
	}
	return ratioGoal(NameVolume, figure, j.Volume.metric(j.Metric), j.Local.metric(j.Metric)/float64(max(j.Divisor, 1)), AtLeast, j.Goal), true
}

// jobFigure names a job's figure briefly, for a goal.
func jobFigure(j FioRatio) string {
	switch j.Name {
	case "seqWrite":
		return "seq write"
	case "seqRead":
		return "seq read"
	case "randWrite":
		return "4 KiB rand write IOPS"
	}
	return j.Name
}

// cpuGoal is the goal on the CPU per request of job j, if it has one: the volume's over
// the local file's, both the machine's whole CPU (FioResult.CPUPerOpMicros).
func (j FioRatio) cpuGoal() (Goal, bool) {
	if j.CPUGoal <= 0 {
		return Goal{}, false
	}
	return ratioGoal(NameVolume, fmt.Sprintf("CPU per %s / local file's", jobRequest(j)), j.Volume.CPUPerOpMicros, j.Local.CPUPerOpMicros, AtMost, j.CPUGoal), true
}

// jobRequest names one request of a job, for its CPU goal.
func jobRequest(j FioRatio) string {
	if j.Name == "randWrite" {
		return "4 KiB rand write"
	}
	return j.Name + " request"
}

// Goals of the volume data path: each fio job's goals, and the rebuild rate.
func (v *Volume) Goals() []Goal {
	var goals []Goal
	for _, j := range v.Jobs {
		if g, ok := j.goal(); ok {
			goals = append(goals, g)
		}
		if g, ok := j.cpuGoal(); ok {
			goals = append(goals, g)
		}
	}
	return append(goals, v.Rebuild.goal())
}

func (r Rebuild) goal() Goal {
	if r.Seconds <= 0 {
		return unmeasuredGoal(NameVolume, "replica rebuild", AtLeast, RebuildGoalMiBPerS, "MiB/s", "not timed")
	}
	return absoluteGoal(NameVolume, "replica rebuild", r.MiBPerSec, AtLeast, RebuildGoalMiBPerS, "MiB/s")
}

// Goals of crdipc up: the median start.
func (u *Up) Goals() []Goal {
	figure := "median start of crdipc up"
	if len(u.Starts) == 0 {
		return []Goal{unmeasuredGoal(NameUp, figure, AtMost, UpGoalSeconds, "s", "no start measured")}
	}
	return []Goal{absoluteGoal(NameUp, figure, u.MedianSeconds, AtMost, UpGoalSeconds, "s")}
}

// Goals of the scale bench, at its largest size; the RSS goal is about ScaleRSSGoalSize
// Books of a process whose memory the bench reads (in process, or --target-metrics).
func (s *Scale) Goals() []Goal {
	rssFigure := fmt.Sprintf("RSS at %d Books", ScaleRSSGoalSize)
	rssGoalMiB := float64(ScaleRSSGoal) / mib
	if len(s.Steps) == 0 {
		why := "no size measured"
		return []Goal{
			unmeasuredGoal(NameScale, "heap per cached Book", AtMost, ScaleCacheBytesGoal, "bytes", why),
			unmeasuredGoal(NameScale, "ipc.Call p50 / at the first size", AtMost, ScaleCallRatioGoal, Ratio, why),
			unmeasuredGoal(NameScale, rssFigure, Below, rssGoalMiB, "MiB", why),
		}
	}
	first, last := s.Steps[0], s.Steps[len(s.Steps)-1]
	goals := []Goal{
		absoluteGoal(NameScale, fmt.Sprintf("heap per cached Book at %d Books", last.Books), last.CacheBytesPer, AtMost, ScaleCacheBytesGoal, "bytes"),
		ratioGoal(NameScale, fmt.Sprintf("ipc.Call p50 at %d Books / at %d", last.Books, first.Books), last.Call.P50, first.Call.P50, AtMost, ScaleCallRatioGoal),
	}
	switch {
	case !s.InProcess && s.TargetMetrics == "":
		goals = append(goals, unmeasuredGoal(NameScale, rssFigure, Below, rssGoalMiB, "MiB", "the cluster's process is not this one: --target-metrics"))
	case last.Books < ScaleRSSGoalSize:
		goals = append(goals, unmeasuredGoal(NameScale, rssFigure, Below, rssGoalMiB, "MiB", fmt.Sprintf("largest size %d Books", last.Books)))
	default:
		goals = append(goals, absoluteGoal(NameScale, fmt.Sprintf("RSS at %d Books", last.Books), float64(last.Memory.RSSBytes)/mib, Below, rssGoalMiB, "MiB"))
	}
	return goals
}

// CollectGoals are the goals of every bench that ran, in the order of Names.
func (a *All) CollectGoals() []Goal {
	goals := []Goal{} // [] in the JSON when no bench ran, not null
	for _, name := range Names {
		switch {
		case name == NameUp && a.Up != nil:
			goals = append(goals, a.Up.Goals()...)
		case name == NameRoundTrip && a.RoundTrip != nil:
			goals = append(goals, a.RoundTrip.Goals()...)
		case name == NameWebhook && a.Webhook != nil:
			goals = append(goals, a.Webhook.Goals()...)
		case name == NameStorage && a.Storage != nil:
			goals = append(goals, a.Storage.Goals()...)
		case name == NameVolume && a.Volume != nil:
			goals = append(goals, a.Volume.Goals()...)
		case name == NameScale && a.Scale != nil:
			goals = append(goals, a.Scale.Goals()...)
		}
	}
	return goals
}
