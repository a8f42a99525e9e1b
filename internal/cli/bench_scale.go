package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"

	"github.com/crdipc/crdipc/internal/bench"
	"github.com/crdipc/crdipc/internal/cpushare"
)

func newBenchScaleCommand() *cobra.Command {
	var target benchTarget
	o := bench.DefaultScaleOptions
	cmd := &cobra.Command{
		Use:   "scale",
		Short: "Measure how costs grow with the number of Books in the cluster",
		Long: `scale grows a population of Books in a namespace of its own through --sizes
(each size adds to the previous one), created by --writers concurrent writers and
served by the Book receiver, and once every Book is Ready (with its Event)
measures at each size:

  heap/cached Book  live heap a fresh cache of the Books adds, built as the
                    services build theirs (managedFields dropped), per Book
                    (goal at the largest size: ≤ 2048 bytes); the median of 3
                    rounds, each against the heap just before and after it, as
                    the control plane's own heap moves too (etcd's compactions)
  cache sync        how long that cache takes to list and sync
  list              a full List of the Books (median of 3), and one in pages
  idle CPU          this process's CPU while nothing is asked of it, in cores,
                    and its division between the components in the process (etcd,
                    kube-apiserver, kube-controller-manager, the books service,
                    bench, and the unlabelled: the Go runtime) from a CPU profile;
                    "not sampled" is what the profiler missed (each thread is
                    sampled per 10 ms of its own CPU, so short bursts go unseen)
  ipc.Call          p50/p99 of --calls sequential Calls of a new Book; p50 as a
                    ratio to the first size's (goal: ≤ 1.2)
  RSS, heap         this process (the control plane and the Book receiver, as
                    in up) and per Book over the baseline before any Book
                    (goal: RSS < 2 GiB at 100,000 Books)

At the end the namespace is deleted, with every Book and Event, and bench waits
until it is gone (bounded). Goals are reported, not enforced.

Without --kubeconfig, bench starts an embedded control plane and the books
service of the service table in this process, as up does; with --kubeconfig
the books service must already run, and the memory figures are bench's own,
unless --target-metrics names the /metrics of the process that serves the
cluster: then its RSS, heap and goroutines (at the baseline and each size) and
its idle CPU are read from there, e.g. all of crdipc up, console included:

  crdipc up &
  crdipc bench scale --kubeconfig .crdipc/kubeconfig \
      --target-metrics http://127.0.0.1:8080/metrics`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Before an embedded control plane is started for nothing.
			if target.kubeconfig == "" && o.TargetMetrics != "" {
				return errors.New("--target-metrics needs --kubeconfig: without it, the cluster is served by this process, whose figures bench reads itself")
			}
			progress := cmd.ErrOrStderr()
			o.Progress = func(format string, a ...any) { fmt.Fprintf(progress, "scale: "+format+"\n", a...) }
			return runBench(cmd, &target, func(ctx context.Context, cfg *rest.Config) (*bench.Scale, error) {
				o.InProcess = target.kubeconfig == ""
				if o.InProcess {
					stop, err := bench.StartBooksService(ctx, cfg)
					if err != nil {
						return nil, err
					}
					defer func() { target.quiet(); stop() }()
				}
				return bench.MeasureScale(ctx, cfg, o)
			}, printScale)
		},
	}
	target.flags(cmd)
	f := cmd.Flags()
	f.IntSliceVar(&o.Sizes, "sizes", o.Sizes, "Book populations to measure, ascending")
	f.IntVar(&o.Writers, "writers", o.Writers, "concurrent writers creating the Books")
	f.IntVar(&o.CallSamples, "calls", o.CallSamples, "sequential ipc.Calls measured at each size")
	f.DurationVar(&o.IdleWindow, "idle-window", o.IdleWindow, "how long idle CPU is sampled")
	f.StringVar(&o.TargetMetrics, "target-metrics", "", "with --kubeconfig: the Prometheus /metrics URL of the process serving the cluster (crdipc up: http://127.0.0.1:8080/metrics), whose memory and idle CPU are then measured instead of bench's own")
	f.StringVar(&o.HeapProfile, "heap-profile", "", "write a pprof heap profile of this process at the largest size to this file")
	return cmd
}

func printScale(out io.Writer, s *bench.Scale) {
	mib := func(b float64) string { return fmt.Sprintf("%.0f", b/(1<<20)) }
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "scale\t")
	for _, st := range s.Steps {
		fmt.Fprintf(tw, "%d Books\t", st.Books)
	}
	fmt.Fprintln(tw)
	// The goals are printed under the table, from Goals().
	row := func(name string, v func(bench.ScaleStep) string) {
		fmt.Fprintf(tw, "%s\t", name)
		for _, st := range s.Steps {
			fmt.Fprintf(tw, "%s\t", v(st))
		}
		fmt.Fprintln(tw)
	}
	row("Events", func(st bench.ScaleStep) string { return fmt.Sprint(st.Events) })
	row("populate: creates/s", func(st bench.ScaleStep) string { return fmt.Sprintf("%.0f", st.CreatesPerSec) })
	row("populate: Ready/s", func(st bench.ScaleStep) string { return fmt.Sprintf("%.0f", st.ReadyPerSec) })
	row("heap/cached Book (bytes)", func(st bench.ScaleStep) string { return fmt.Sprintf("%.0f", st.CacheBytesPer) })
	row("… its rounds, least–most", func(st bench.ScaleStep) string {
		if len(st.CacheBytesRounds) == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f–%.0f", slices.Min(st.CacheBytesRounds), slices.Max(st.CacheBytesRounds))
	})
	row("heap/empty cache (KiB)", func(st bench.ScaleStep) string { return fmt.Sprintf("%.0f", st.CacheFixedBytes/1024) })
	row("cache sync (ms)", func(st bench.ScaleStep) string { return fmt.Sprintf("%.0f", st.CacheSyncMs) })
	row("full list (ms)", func(st bench.ScaleStep) string { return fmt.Sprintf("%.0f", st.ListMs) })
	row(fmt.Sprintf("list in pages of %d (ms)", s.Steps[0].PagedListLimit), func(st bench.ScaleStep) string { return fmt.Sprintf("%.0f", st.PagedListMs) })
	row("idle CPU (cores)", func(st bench.ScaleStep) string { return fmt.Sprintf("%.3f", st.IdleCores) })
	if comps := idleComponents(s); len(comps) > 0 {
		for _, name := range comps {
			row("… "+name, func(st bench.ScaleStep) string { return fmt.Sprintf("%.3f", st.IdleCoresBy[name]) })
		}
		// The profiler samples each thread every 10 ms of its own CPU: bursts shorter
		// than that, spread over many threads, leave no sample.
		row("… not sampled", func(st bench.ScaleStep) string {
			return fmt.Sprintf("%.3f", max(st.IdleCores-st.IdleCoresBy.Total(), 0))
		})
	}
	row("ipc.Call p50 (ms)", func(st bench.ScaleStep) string { return fmt.Sprintf("%.1f", st.Call.P50) })
	row("ipc.Call p99 (ms)", func(st bench.ScaleStep) string { return fmt.Sprintf("%.1f", st.Call.P99) })
	row("ipc.Call failures", func(st bench.ScaleStep) string { return fmt.Sprint(st.CallErrors) })
	row("ipc.Call p50 / first size", func(st bench.ScaleStep) string { return fmt.Sprintf("%.2f", st.CallP50Ratio) })
	who := "bench"
	switch {
	case s.InProcess:
		who = "process"
	case s.TargetMetrics != "":
		who = "target"
	}
	// What only a process's own runtime can read is not in its metrics.
	own := func(v uint64) string {
		if s.TargetMetrics != "" {
			return "-"
		}
		return mib(float64(v))
	}
	row(who+" RSS (MiB)", func(st bench.ScaleStep) string { return mib(float64(st.Memory.RSSBytes)) })
	row(who+" peak RSS (MiB)", func(st bench.ScaleStep) string { return own(st.Memory.PeakRSSBytes) })
	row(who+" RSS of files mapped (MiB)", func(st bench.ScaleStep) string { return own(st.Memory.RSSFileBytes) })
	row(who+" RSS, free pages released (MiB)", func(st bench.ScaleStep) string { return own(st.Memory.ReleasedRSSBytes) })
	row(who+" heap (MiB)", func(st bench.ScaleStep) string { return mib(float64(st.Memory.HeapBytes)) })
	row(who+" heap in use, stacks (MiB)", func(st bench.ScaleStep) string {
		return mib(float64(st.Memory.HeapInuseBytes)) + ", " + mib(float64(st.Memory.StackBytes))
	})
	row("RSS/Book over baseline (bytes)", func(st bench.ScaleStep) string { return fmt.Sprintf("%.0f", st.RSSPerBook) })
	row("heap/Book over baseline (bytes)", func(st bench.ScaleStep) string { return fmt.Sprintf("%.0f", st.HeapPerBook) })
	row("goroutines", func(st bench.ScaleStep) string { return fmt.Sprint(st.Memory.Goroutines) })
	tw.Flush()
	if s.TargetMetrics != "" {
		fmt.Fprintf(out, "target: the process serving %s, as its metrics say: its heap is what it has allocated, garbage not yet collected included\n", s.TargetMetrics)
	}
	fmt.Fprintf(out, "baseline before any Book: RSS %s MiB (%s released), heap %s MiB, %d goroutines, idle CPU %.3f cores",
		mib(float64(s.Baseline.RSSBytes)), own(s.Baseline.ReleasedRSSBytes), mib(float64(s.Baseline.HeapBytes)), s.Baseline.Goroutines, s.BaselineIdleCores)
	if comps := idleComponents(s); len(comps) > 0 {
		sep := " ("
		for _, name := range comps {
			fmt.Fprintf(out, "%s%s %.3f", sep, name, s.BaselineIdleCoresBy[name])
			sep = ", "
		}
		fmt.Fprint(out, ")")
	}
	fmt.Fprintln(out)
	if s.IdleByComponentError != "" {
		fmt.Fprintf(out, "idle CPU by component: not measured: %s\n", s.IdleByComponentError)
	}
	for _, st := range s.Steps {
		if st.ListError != "" {
			fmt.Fprintf(out, "at %d Books, a list failed: %s\n", st.Books, st.ListError)
		}
		if st.CallError != "" {
			fmt.Fprintf(out, "at %d Books, first failed Call: %s\n", st.Books, st.CallError)
		}
	}
	if s.CleanupError != "" {
		fmt.Fprintf(out, "cleanup: %s\n", s.CleanupError)
	} else {
		fmt.Fprintf(out, "cleanup: namespace deleted in %.1f s\n", s.CleanupSeconds)
	}
	fmt.Fprintln(out)
	printGoals(out, s.Goals(), false)
}

// idleComponents names the components idle CPU was divided between, in any step or the
// baseline: by name, with what carries no component last.
func idleComponents(s *bench.Scale) []string {
	seen := map[string]bool{}
	for name := range s.BaselineIdleCoresBy {
		seen[name] = true
	}
	for _, st := range s.Steps {
		for name := range st.IdleCoresBy {
			seen[name] = true
		}
	}
	names := slices.Sorted(maps.Keys(seen))
	if i := slices.Index(names, cpushare.Unattributed); i >= 0 {
		names = append(slices.Delete(names, i, i+1), cpushare.Unattributed)
	}
	return names
}
