package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/crdipc/crdipc/internal/bench"
)

func newBenchUpCommand() *cobra.Command {
	var target benchTarget // its JSON output only: bench up measures no cluster
	o := bench.DefaultUpOptions
	cmd := &cobra.Command{
		Use:   "up [-- up flags]",
		Short: "Measure how long `crdipc up` takes to start from a fresh data dir",
		Long: `up starts "crdipc up" --starts times, each in a fresh temporary directory
with the default data dir (.crdipc) and default flags, as the README runs it,
waits until it says it is up (every service ready), interrupts it as Ctrl-C
would and waits until it has stopped. The first --warmup starts are not counted:
the first start after a build reads the binary from disk.

It prints each start's phases as up reports them (certificates, etcd, the API
server serving, the CRDs, readiness, the services) and the median of the
starts (goal: 2.5 s). Flags after -- are passed to up (e.g. -- --nodes 1).
Nothing else should run meanwhile: the start is CPU-bound, and other work on
the machine is measured with it.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Args = args
			errOut := cmd.ErrOrStderr()
			o.Progress = func(format string, a ...any) { fmt.Fprintf(errOut, "bench up: "+format+"\n", a...) }
			u, err := bench.MeasureUp(cmd.Context(), o)
			if err != nil {
				return err
			}
			printUp(cmd.OutOrStdout(), u)
			return target.writeJSON(cmd.OutOrStdout(), u)
		},
	}
	cmd.Flags().StringVar(&target.jsonPath, "json", "", "also write the results as JSON to this file ('-' for stdout)")
	cmd.Flags().IntVar(&o.Starts, "starts", o.Starts, "measured starts, each from a fresh data dir")
	cmd.Flags().IntVar(&o.Warmup, "warmup", o.Warmup, "starts run first and not counted")
	cmd.Flags().StringVar(&o.Binary, "binary", "", "the crdipc binary to start (default: this one)")
	cmd.Flags().DurationVar(&o.Timeout, "timeout", o.Timeout, "longest a start (until up, then stopped) may take")
	return cmd
}

// printUp prints one column per start, one row per phase, and the median.
func printUp(out io.Writer, u *bench.Up) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "crdipc %s (ms)\t", strings.Join(u.Args, " "))
	for i := range u.Starts {
		fmt.Fprintf(tw, "#%d\t", i+1)
	}
	fmt.Fprintln(tw)
	for _, n := range u.PhaseNames() {
		fmt.Fprintf(tw, "%s\t", n)
		for _, s := range u.Starts {
			v := ""
			if ms, ok := s.PhaseMs(n); ok {
				v = fmt.Sprintf("%.0f", ms)
			}
			fmt.Fprintf(tw, "%s\t", v)
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprintf(tw, "up in (s)\t")
	for _, s := range u.Starts {
		fmt.Fprintf(tw, "%.2f\t", s.Seconds)
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "stopped in (s)\t")
	for _, s := range u.Starts {
		fmt.Fprintf(tw, "%.1f\t", s.StopSeconds)
	}
	fmt.Fprintln(tw)
	tw.Flush()
	fmt.Fprintf(out, "median of %d starts: %.2f s\n\n", len(u.Starts), u.MedianSeconds)
	printGoals(out, u.Goals(), false)
}
