package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/perf/benchmath"

	"github.com/crdipc/crdipc/internal/bench"
)

// abTolerance is how far a job's median ratio may move between two builds before the A/B
// comparison calls it a regression (or a gain), if the runs also differ by rank (moved).
const abTolerance = 0.10

// moved compares runs a of one figure with runs b: q is median(a) / median(b); up and down
// say whether q is beyond abTolerance and the runs also differ by rank, as benchstat
// decides it: a Mann-Whitney U test at α 0.05 (medians alone call a move of two noisy runs
// a regression; five runs of this machine's disk span 2×). p is the test's, "-" when the
// runs are too few for it ever to reject (fewer than 5 each): then the median's move
// decides alone.
func moved(a, b []float64) (q float64, up, down bool, p string) {
	q = median(a) / median(b)
	significant, p := true, "-"
	if min(len(a), len(b)) >= 5 {
		c := benchmath.AssumeNothing.Compare(
			benchmath.NewSample(slices.Clone(a), &benchmath.DefaultThresholds),
			benchmath.NewSample(slices.Clone(b), &benchmath.DefaultThresholds))
		significant, p = c.P <= c.Alpha, fmt.Sprintf("%.3f", c.P)
	}
	return q, significant && q > 1+abTolerance, significant && q < 1-abTolerance, p
}

// runVolumeAB runs `bench volume` of this binary and of other in turn, runs times each,
// with the flags cmd was given (but --binary, --runs and --json), and prints each job's
// median volume/local ratio for both and their quotient. Taking turns spreads a shared
// machine's drift over both builds alike.
func runVolumeAB(cmd *cobra.Command, other string, runs int) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if other, err = exec.LookPath(other); err != nil {
		return fmt.Errorf("--binary: %w", err)
	}
	var args []string
	cmd.Flags().Visit(func(f *pflag.Flag) {
		switch f.Name {
		case "binary", "runs", "json":
			return
		}
		args = append(args, "--"+f.Name+"="+f.Value.String())
	})
	tmp, err := os.MkdirTemp("", "crdipc-bench-ab-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	results := map[string][]*bench.Volume{}
	builds := []string{self, other}
	for i := range runs {
		for _, b := range builds {
			out := filepath.Join(tmp, fmt.Sprintf("run-%d-%d.json", i, len(results[b])))
			fmt.Fprintf(cmd.ErrOrStderr(), "bench volume A/B: run %d of %d, %s\n", i+1, runs, b)
			c := exec.CommandContext(cmd.Context(), b, append([]string{"bench", "volume", "--json", out}, args...)...)
			c.Stdout, c.Stderr = io.Discard, cmd.ErrOrStderr()
			if err := c.Run(); err != nil {
				return fmt.Errorf("%s bench volume: %w", b, err)
			}
			data, err := os.ReadFile(out)
			if err != nil {
				return err
			}
			var v bench.Volume
			if err := json.Unmarshal(data, &v); err != nil {
				return fmt.Errorf("%s bench volume: its JSON: %w", b, err)
			}
			results[b] = append(results[b], &v)
		}
	}
	return printVolumeAB(cmd.OutOrStdout(), self, other, results[self], results[other])
}

// verdicts gathers the figures that moved between the two builds, by name.
type verdicts struct{ worse, better []string }

// judge compares figure name's runs a (this build) with b (the other's) and notes it if it
// moved (moved); for a cost (lowerIsBetter) up is worse. It returns the quotient of the
// medians and the test's p.
func (v *verdicts) judge(name string, a, b []float64, lowerIsBetter bool) (q float64, p string) {
	q, up, down, p := moved(a, b)
	if lowerIsBetter {
		up, down = down, up
	}
	switch {
	case down:
		v.worse = append(v.worse, fmt.Sprintf("%s %.2f×", name, q))
	case up:
		v.better = append(v.better, fmt.Sprintf("%s %.2f×", name, q))
	}
	return q, p
}

// printVolumeAB prints the A/B table and fails when a job's median is slower than the
// other build's by more than abTolerance, or, for a job with a CPU goal, its CPU per request
// (× the local file's) higher by more, each only where the runs differ by rank too (moved);
// one better is named, not failed.
func printVolumeAB(out io.Writer, self, other string, a, b []*bench.Volume) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "job (median volume/local ratio of %d runs each)\tthis\tother\tthis/other\tp\truns (this)\truns (other)\t\n", len(a))
	var v verdicts
	for _, j := range a[0].Jobs {
		ra, rb := jobValues(a, j.Name, ratioOf), jobValues(b, j.Name, ratioOf)
		if len(rb) == 0 {
			fmt.Fprintf(tw, "%s\t%.2f\t-\t-\t-\t%s\t\t\n", j.Description, median(ra), fmtRatios(ra))
			continue
		}
		q, p := v.judge(j.Name, ra, rb, false)
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%s\t%s\t%s\t\n", j.Description, median(ra), median(rb), q, p, fmtRatios(ra), fmtRatios(rb))
	}
	// CPU per request, volume over local: lower is better. Compared for the jobs with a CPU
	// goal only: a short job's local side (a sequential read of 512 MiB takes a tenth of a
	// second) costs hardly more than fio's start, so its ratio says little. An older build
	// may not measure it.
	for _, j := range a[0].Jobs {
		ca, cb := jobValues(a, j.Name, cpuRatioOf), jobValues(b, j.Name, cpuRatioOf)
		if j.CPUGoal <= 0 || len(ca) == 0 || len(cb) == 0 {
			continue
		}
		q, p := v.judge(j.Name+" CPU", ca, cb, true)
		fmt.Fprintf(tw, "CPU per request of %s, × local's\t%.1f\t%.1f\t%.2f\t%s\t%s\t%s\t\n", j.Name, median(ca), median(cb), q, p, fmtRatios(ca), fmtRatios(cb))
	}
	tw.Flush()
	fmt.Fprintf(out, "(this: %s; other: %s)\n", self, other)
	rule := fmt.Sprintf("by more than %.0f%% and by rank (U test, p ≤ 0.05)", abTolerance*100)
	if min(len(a), len(b)) < 5 {
		rule = fmt.Sprintf("by more than %.0f%% (medians only: fewer than 5 runs each cannot pass a rank test)", abTolerance*100)
	}
	if len(v.better) > 0 {
		fmt.Fprintf(out, "better than the other build %s: %s\n", rule, strings.Join(v.better, ", "))
	}
	if len(v.worse) > 0 {
		return fmt.Errorf("bench volume A/B: worse than the other build %s: %s", rule, strings.Join(v.worse, ", "))
	}
	fmt.Fprintf(out, "no job worse than the other build's %s\n", rule)
	return nil
}

func ratioOf(j bench.FioRatio) float64    { return j.Ratio }
func cpuRatioOf(j bench.FioRatio) float64 { return j.CPURatio }

// jobValues is what of measures of job name in each run that has it (a value > 0).
func jobValues(runs []*bench.Volume, name string, of func(bench.FioRatio) float64) []float64 {
	var vs []float64
	for _, v := range runs {
		for _, j := range v.Jobs {
			if x := of(j); j.Name == name && x > 0 {
				vs = append(vs, x)
			}
		}
	}
	return vs
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func fmtRatios(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(s, " ")
}
