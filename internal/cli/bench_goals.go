package cli

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/crdipc/crdipc/internal/bench"
)

// printGoals prints goals, one a line, with the figure measured and met or missed; with
// withBench, the bench each is of (bench all's summary).
func printGoals(out io.Writer, goals []bench.Goal, withBench bool) {
	if len(goals) == 0 {
		return
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	if withBench {
		fmt.Fprint(tw, "bench\t")
	}
	fmt.Fprintln(tw, "goal\tvalue\twanted")
	for _, g := range goals {
		if withBench {
			fmt.Fprintf(tw, "%s\t", g.Bench)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", g.Figure, g.ValueText(), g.GoalText(), g.Verdict())
	}
	tw.Flush()
	if withBench {
		met := 0
		for _, g := range goals {
			if g.Met {
				met++
			}
		}
		fmt.Fprintf(out, "%d of %d goals met\n", met, len(goals))
	}
}

// printAPIRequests prints what one operation (a "call", a "delivery", a "volume") of a
// critical path costs the API server, and how that was counted.
func printAPIRequests(out io.Writer, op string, r *bench.APIRequests) {
	if r == nil {
		return
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "API writes per %s: %.2f%s; reads/round trips: %.2f%s\n", op, r.Writes, breakdown(r.WritesBy, "%.2f"), r.Reads, breakdown(r.ReadsBy, "%.2f"))
	fmt.Fprintf(out, "  counted by apiserver_request_total, read from %s, over %s, for %s only\n", r.Source, r.Phase, strings.Join(r.Counted, ", "))
	if r.Etcd > 0 || r.WatchEvents > 0 {
		fmt.Fprintf(out, "  behind them: etcd requests %.2f%s; watch events sent %.2f%s\n", r.Etcd, breakdown(r.EtcdBy, "%.2f"), r.WatchEvents, breakdown(r.WatchEventsBy, "%.2f"))
	}
	if len(r.OtherWrites) > 0 {
		var total float64
		for _, v := range r.OtherWrites {
			total += v
		}
		fmt.Fprintf(out, "  writes to other resources meanwhile, not counted: %.0f%s\n", total, breakdown(r.OtherWrites, "%.0f"))
	}
	if r.Unsettled {
		fmt.Fprintln(out, "  the counter still moved when the count ended: the figures may be a few requests off")
	}
}

// breakdown is " (name v, name v, …)", the largest first, or "" for none.
func breakdown(by map[string]float64, format string) string {
	if len(by) == 0 {
		return ""
	}
	names := slices.SortedFunc(maps.Keys(by), func(a, b string) int {
		return cmp.Or(cmp.Compare(by[b], by[a]), strings.Compare(a, b))
	})
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + " " + fmt.Sprintf(format, by[n])
	}
	return " (" + strings.Join(parts, ", ") + ")"
}
