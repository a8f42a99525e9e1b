package cli

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/crdipc/crdipc/internal/bench"
	"github.com/crdipc/crdipc/internal/bench/plot"
)

func newBenchPlotCommand() *cobra.Command {
	var in, outDir string
	cmd := &cobra.Command{
		Use:   "plot --in results.json --out dir",
		Short: "Draw the JSON of bench all as PNG figures",
		Long: `plot reads the JSON that "bench all --json" wrote and draws into --out, for
docs/performance.md:

  up.png             crdipc up's starts, each stacked from its phases, against
                     the goal
  latency.png        ipc.Call's latency distribution against the floor's
                     create→status→watch; the webhook's and storage's against
                     theirs
  throughput.png     Calls/s per sender count next to the floor's ceiling
                     (creates/s ÷ 3) and the same three writes without ipc; the
                     webhook's and storage's rates as shares of their ceilings
  scale-memory.png   RSS and heap, per Book and per cached Book, against the
                     number of Books, with the goals
  scale-latency.png  ipc.Call p50/p99, lists and cache syncs against the
                     number of Books
  volume.png         each fio job's volume/local-file ratio, and the rebuild

A figure whose bench did not run is skipped, and plot says so. It measures
nothing and starts no control plane. "make performance" runs it on
docs/performance/results.json.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			data, err := os.ReadFile(in)
			if err != nil {
				return err
			}
			var a bench.All
			if err := json.Unmarshal(data, &a); err != nil {
				return fmt.Errorf("%s: %w", in, err)
			}
			if a.Floor == nil && a.RoundTrip == nil && a.Webhook == nil && a.Storage == nil && a.Volume == nil && a.Scale == nil {
				return fmt.Errorf("%s holds no results of any bench: want the JSON of bench all", in)
			}
			if err := os.MkdirAll(outDir, 0o755); err != nil {
				return err
			}
			results, err := plot.Draw(&a, outDir)
			out := cmd.OutOrStdout()
			for _, r := range results {
				if r.Path != "" {
					fmt.Fprintf(out, "wrote %s\n", r.Path)
				} else {
					fmt.Fprintf(out, "skipped %s: %s\n", r.File, r.Skipped)
				}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&in, "in", "", "the JSON of bench all")
	f.StringVar(&outDir, "out", "", "directory to write the PNGs to (created if missing)")
	for _, name := range []string{"in", "out"} {
		if err := cmd.MarkFlagRequired(name); err != nil {
			panic(err) // a flag defined just above
		}
	}
	return cmd
}
