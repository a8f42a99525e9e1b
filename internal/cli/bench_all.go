package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"

	"github.com/crdipc/crdipc/internal/bench"
	"github.com/crdipc/crdipc/internal/cpushare"
)

func newBenchAllCommand() *cobra.Command {
	var target benchTarget
	var quick bool
	var scaleSizes []int
	var skip []string
	var volumeDir, endpoint string
	nodes := 3
	cmd := &cobra.Command{
		Use:   "all",
		Short: "Run every bench, one after the other, and write one JSON of them all",
		Long: `all runs every bench on one cluster, one after the other, prints each one's
table as it finishes, ends with a summary of every bench's goals, met or
missed, and writes the results of all of them, with the date, this machine
(CPUs, memory, kernel, Go) and the goals, as one JSON (--json) for "bench plot":

  up          five starts of crdipc up from a fresh data dir    ~30 s
  floor       the API server alone                              ~10 s
  roundtrip   ipc.Call through the Book receiver                ~30 s
  webhook     the GitHub webhook listener                       ~25 s
  storage     CStorVolume create → Ready                        ~30 s
  volume      a replicated volume's data path against a file    ~1 min
  scale       costs against the number of Books (--scale-sizes) ~25 min

Before each bench it waits until the namespaces of the previous one are
deleted, so that none measures an API server busy deleting the last one's
objects. Storage and volume share one set of storage services and one claim's
pools. Scale runs last: at 100,000 Books this process (control plane included)
grows to several GiB of RSS, and deleting the Books takes about ten minutes.
The full run takes about 30 minutes on a 2-core machine; --scale-sizes
1000,10000 or --skip scale make it a few minutes. --quick shrinks every bench
to seconds (a smoke test: the figures say that everything works, not how fast).

The volume bench needs fio, /dev/fuse, loop devices and mount privilege (root):
where this host lacks one, volume is skipped and the JSON says why, unless
CRDIPC_REQUIRE_FIO=1 or CRDIPC_REQUIRE_MOUNT=1 makes that an error. Any other
failure of a bench ends the run with an error, and no JSON is written.

Without --kubeconfig, all starts an embedded control plane and, in this
process, the services the benches measure through, as the single benches do.
With --kubeconfig they must already run (crdipc up), and the volume bench
needs --endpoint, the socket of a CSI driver serving a node of that cluster.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := bench.DefaultAllOptions()
			if quick {
				o = bench.QuickAllOptions()
			}
			if cmd.Flags().Changed("scale-sizes") {
				o.Scale.Sizes = scaleSizes
			}
			o.Skip = skip
			skipped, err := bench.ParseSkip(skip)
			if err != nil {
				return fmt.Errorf("--skip: %w", err)
			}
			if target.kubeconfig != "" && endpoint == "" && !skipped[bench.NameVolume] {
				return errors.New("--kubeconfig: the volume bench needs --endpoint, the socket of a CSI driver serving a node of that cluster (or --skip volume)")
			}
			o.Volume.Endpoint, o.Volume.Dir = endpoint, volumeDir
			// Checked before a run of half an hour, not after it.
			out, err := newResultFile(target.jsonPath)
			if err != nil {
				return err
			}
			defer out.discard()
			return runBenchAll(cmd, &target, o, quick, nodes, out)
		},
	}
	target.flags(cmd)
	f := cmd.Flags()
	f.BoolVar(&quick, "quick", false, "shrink every bench to seconds: a smoke test, not figures for the record")
	f.IntSliceVar(&scaleSizes, "scale-sizes", bench.DefaultScaleOptions.Sizes, "Book populations of the scale bench, ascending")
	f.StringSliceVar(&skip, "skip", nil, "benches not to run: "+strings.Join(bench.Names, ", "))
	f.StringVar(&volumeDir, "volume-dir", "", "directory of the volume bench's local file, mounts and, without --kubeconfig, the nodes' pools (default $TMPDIR)")
	f.StringVar(&endpoint, "endpoint", "", "with --kubeconfig: CSI driver socket (unix://…) the volume bench measures through")
	f.IntVar(&nodes, "nodes", nodes, "simulated nodes to start for storage and volume (embedded control plane only)")
	return cmd
}

func runBenchAll(cmd *cobra.Command, target *benchTarget, o bench.AllOptions, quick bool, nodes int, result *resultFile) error {
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	ctx := cmd.Context()
	cfg, release, err := target.cluster(ctx, out)
	if err != nil {
		return err
	}
	defer release()
	// Services stopping cancel work in flight and would report it as errors; once they
	// are stopped, the next bench's errors are wanted again.
	stopQuietly := func(stop func()) { target.quiet(); stop(); target.logLevel.SetLevel(zapcore.ErrorLevel) }
	embedded := target.kubeconfig == ""
	if embedded {
		dir := o.Volume.Dir
		o.StartStorage = func(ctx context.Context, withDriver bool) (string, string, func(), error) {
			return startBenchStorage(ctx, cfg, nodes, dir, withDriver, errOut, stopQuietly)
		}
		o.StartBooks = func(ctx context.Context) (func(), error) {
			stop, err := bench.StartBooksService(ctx, cfg)
			if err != nil {
				return nil, err
			}
			return func() { stopQuietly(stop) }, nil
		}
	}
	o.Up.Progress = func(format string, a ...any) { fmt.Fprintf(errOut, "up: "+format+"\n", a...) }
	o.InProcess = embedded
	o.Scale.Progress = func(format string, a ...any) { fmt.Fprintf(errOut, "scale: "+format+"\n", a...) }
	o.Progress = func(format string, a ...any) { fmt.Fprintf(errOut, "bench all: "+format+"\n", a...) }
	o.Done = func(name string, a *bench.All) {
		fmt.Fprintf(out, "\n%s (%.0f s)\n", name, a.Seconds[name])
		printAllSection(out, name, a)
	}
	var a *bench.All
	cpushare.Do("bench", func() { a, err = bench.MeasureAll(ctx, cfg, o) })
	if err != nil {
		return err
	}
	a.Quick = quick
	a.Target = "embedded control plane"
	if !embedded {
		a.Target = cfg.Host
	}
	if len(a.Skipped) > 0 {
		fmt.Fprintln(out)
		for _, n := range bench.Names {
			if why, ok := a.Skipped[n]; ok {
				fmt.Fprintf(out, "skipped %s: %s\n", n, why)
			}
		}
	}
	if len(a.Goals) > 0 {
		fmt.Fprintln(out)
		fmt.Fprintln(out, "goals of every bench that ran:")
		printGoals(out, a.Goals, true)
	}
	return result.write(out, a)
}

// startBenchStorage runs the storage services (and with withDriver the CSI driver) as
// bench storage and bench volume do, with the nodes' pools in a new directory under dir;
// the returned stop stops them and removes the directory unless something is still
// mounted in it.
func startBenchStorage(ctx context.Context, cfg *rest.Config, nodes int, dir string, withDriver bool, warn io.Writer, stopQuietly func(func())) (string, string, func(), error) {
	work, err := os.MkdirTemp(dir, "crdipc-bench-all-")
	if err != nil {
		return "", "", nil, err
	}
	var stop func()
	endpoint := ""
	if withDriver {
		stop, endpoint, err = startVolumeServices(ctx, cfg, nodes, work, nil)
	} else {
		stop, err = startStorage(ctx, cfg, nodes, filepath.Join(work, "nodes"))
	}
	if err != nil {
		os.RemoveAll(work)
		return "", "", nil, err
	}
	return endpoint, work, func() {
		stopQuietly(stop)
		removeUnmounted(warn, work)
	}, nil
}

func printAllSection(out io.Writer, name string, a *bench.All) {
	switch name {
	case bench.NameUp:
		printUp(out, a.Up)
	case bench.NameFloor:
		printFloor(out, a.Floor)
	case bench.NameRoundTrip:
		printRoundTrip(out, a.RoundTrip)
	case bench.NameWebhook:
		printWebhook(out, a.Webhook)
	case bench.NameStorage:
		printStorage(out, a.Storage)
	case bench.NameVolume:
		printVolume(out, a.Volume)
	case bench.NameScale:
		printScale(out, a.Scale)
	}
}

// resultFile is where the JSON goes: stdout ("-"), nowhere (""), or a file written whole
// at the end — a temporary file in the same directory, created at the start so that an
// unwritable path fails before the run, renamed over the path when everything succeeded.
type resultFile struct {
	path string
	tmp  *os.File
}

func newResultFile(path string) (*resultFile, error) {
	r := &resultFile{path: path}
	if path == "" || path == "-" {
		return r, nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return nil, fmt.Errorf("--json: %w", err)
	}
	r.tmp = tmp
	return r, nil
}

func (r *resultFile) write(out io.Writer, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	switch r.path {
	case "":
		return nil
	case "-":
		_, err := out.Write(data)
		return err
	}
	if _, err := r.tmp.Write(data); err != nil {
		return err
	}
	if err := r.tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := r.tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(r.tmp.Name(), r.path); err != nil {
		return err
	}
	r.tmp = nil
	fmt.Fprintf(out, "wrote %s\n", r.path)
	return nil
}

// discard removes the temporary file of a run that wrote nothing.
func (r *resultFile) discard() {
	if r.tmp != nil {
		r.tmp.Close()
		os.Remove(r.tmp.Name())
	}
}
