package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	uberzap "go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/crdipc/crdipc/internal/bench"
	"github.com/crdipc/crdipc/internal/controlplane"
	"github.com/crdipc/crdipc/internal/cpushare"
	"github.com/crdipc/crdipc/internal/services"
	"github.com/crdipc/crdipc/internal/tracing"
)

func newBenchCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure crdipc against the API server floor of the same run",
		Long: `bench runs performance measurements. Each one first measures the floor
(what the API server alone does with small custom resources on this machine,
right now) and reports crdipc's figures as ratios to it, because absolute
numbers on a shared machine drift from run to run while ratios do not.
"bench volume" measures the data path instead, and its floor is a plain
local file on the same disk, put through the same fio jobs.

Without --kubeconfig, bench starts its own embedded control plane in a
temporary directory and removes it afterwards.`,
	}
	var cpuProfile string
	var stopProfile func()
	cmd.PersistentFlags().StringVar(&cpuProfile, "cpu-profile", "", "write a pprof CPU profile of the whole run (control plane included) to this file; each sample carries the label crdipc.component (etcd, kube-apiserver, kube-controller-manager, a service, bench), to cut it with go tool pprof -tagfocus")
	cmd.PersistentPreRunE = func(*cobra.Command, []string) error {
		if cpuProfile == "" {
			return nil
		}
		f, err := os.Create(cpuProfile)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("cpu profile: %w", err)
		}
		stopProfile = func() { pprof.StopCPUProfile(); f.Close() }
		return nil
	}
	cmd.PersistentPostRun = func(*cobra.Command, []string) {
		if stopProfile != nil {
			stopProfile()
		}
	}
	cmd.AddCommand(newBenchFloorCommand(), newBenchRoundTripCommand(), newBenchWebhookCommand(), newBenchStorageCommand(), newBenchVolumeCommand(), newBenchBackupCommand(), newBenchScaleCommand(), newBenchUpCommand(), newBenchAllCommand(), newBenchPlotCommand())
	return cmd
}

type benchTarget struct {
	kubeconfig string
	jsonPath   string
	logLevel   uberzap.AtomicLevel
	// memory is the embedded control plane's process limit, as up's.
	memory memoryLimit
	// tracing, when set, traces the embedded kube-apiserver too (see traced).
	tracing *tracing.Provider
}

// traced turns tracing on for a bench, as up traces: spans kept in memory (up's store
// for its console), and exported where the OTEL_EXPORTER_OTLP_* variables say. The
// embedded control plane then traces too; stop it with the func returned, after the
// bench.
func (b *benchTarget) traced(ctx context.Context) (*tracing.Provider, func(), error) {
	p, err := tracing.New(ctx, tracing.Options{Store: tracing.NewStore(upTraces, 0)})
	if err != nil {
		return nil, nil, err
	}
	b.tracing = p
	return p, func() { _ = p.ShutdownWithin(5 * time.Second) }, nil
}

// quiet silences the in-process services' logs: once the measurement is over, stopping
// them cancels work in flight, which they would otherwise report as errors.
func (b *benchTarget) quiet() { b.logLevel.SetLevel(zapcore.FatalLevel) }

func (b *benchTarget) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&b.kubeconfig, "kubeconfig", "", "measure this cluster instead of an embedded control plane")
	cmd.Flags().StringVar(&b.jsonPath, "json", "", "also write the results as JSON to this file ('-' for stdout)")
	b.memory.flag(cmd)
}

// cluster returns a client config for the cluster to measure and a func
// that releases it.
func (b *benchTarget) cluster(ctx context.Context, out io.Writer) (*rest.Config, func(), error) {
	// In-process receivers log only their errors, to stderr, away from the table.
	b.logLevel = uberzap.NewAtomicLevelAt(zapcore.ErrorLevel)
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(b.logLevel)))
	if b.kubeconfig != "" {
		cfg, err := (&services.ClusterFlags{Kubeconfig: b.kubeconfig}).Config()
		return cfg, func() {}, err
	}
	limit, err := b.memory.apply()
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "crdipc-bench-")
	if err != nil {
		return nil, nil, err
	}
	t := time.Now()
	cpc := controlplane.Config{DataDir: dir, CRDs: true}
	if b.tracing.Enabled() {
		cpc.TracerProvider = b.tracing.APIServer()
	}
	cp, err := controlplane.Start(ctx, cpc)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	release := func() {
		_ = cp.Stop()
		os.RemoveAll(dir)
	}
	fmt.Fprintf(out, "embedded control plane ready in %.2f s (memory limit %s)\n", time.Since(t).Seconds(), limit)
	return cp.RESTConfig, release, nil
}

func (b *benchTarget) writeJSON(out io.Writer, v any) error {
	if b.jsonPath == "" {
		return nil
	}
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if b.jsonPath == "-" {
		_, err = out.Write(data)
		return err
	}
	return os.WriteFile(b.jsonPath, data, 0o644)
}

func newBenchFloorCommand() *cobra.Command {
	var target benchTarget
	o := bench.DefaultFloorOptions
	cmd := &cobra.Command{
		Use:   "floor",
		Short: "Measure the raw API server: creates/s and watch latencies",
		Long: `floor measures what the API server alone does with a small custom
resource (a Book), with unthrottled clients:

  creates/s           with 1, 8 and 32 concurrent writers (own connection each)
  create→watch        create call start until the creator's watch delivers it
  create→status→watch create; a second client sees it and writes status; the
                      creator's watch delivers the status. No request/response
                      over custom resources can be faster than this.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBench(cmd, &target, func(ctx context.Context, cfg *rest.Config) (*bench.Floor, error) {
				return bench.MeasureFloor(ctx, cfg, o)
			}, printFloor)
		},
	}
	target.flags(cmd)
	cmd.Flags().IntVar(&o.Creates, "creates", o.Creates, "objects created per concurrency level")
	cmd.Flags().IntVar(&o.Samples, "samples", o.Samples, "round trips per latency measurement")
	cmd.Flags().IntSliceVar(&o.Writers, "writers", o.Writers, "concurrency levels for the create throughput test")
	return cmd
}

func printFloor(out io.Writer, f *bench.Floor) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "floor\tvalue\t")
	writers := make([]int, 0, len(f.CreatesPerSec))
	for w := range f.CreatesPerSec {
		writers = append(writers, w)
	}
	slices.Sort(writers)
	for _, w := range writers {
		fmt.Fprintf(tw, "creates/s, %d writers\t%.0f\t\n", w, f.CreatesPerSec[w])
	}
	lat := func(name string, l bench.Latencies) {
		fmt.Fprintf(tw, "%s p50 (ms)\t%.2f\t\n%s p99 (ms)\t%.2f\t\n", name, l.P50, name, l.P99)
	}
	lat("create→watch", f.CreateToWatch)
	lat("create→status→watch", f.StatusRoundTrip)
	tw.Flush()
}

func newBenchRoundTripCommand() *cobra.Command {
	var target benchTarget
	var traced bool
	o := bench.DefaultRoundTripOptions
	cmd := &cobra.Command{
		Use:   "roundtrip",
		Short: "Measure ipc.Call through the real Book receiver, as ratios to the floor",
		Long: `roundtrip measures the floor (see "bench floor"), starts the Book receiver
in this process and measures ipc.Call round trips through it:

  latency      one sender, p50/p99, as a ratio to the floor's
               create→status→watch round trip (goals: ≤ 1.2× and ≤ 1.5×)
  throughput   Calls/s with 1, 8 and 32 senders, as a ratio to the same
               three writes a request costs — its create, its status and
               its Event — made back to back by as many writers without ipc:
               what ipc itself costs (goal: ≥ 0.9 at 8 and at 32 senders).
               Next to it, for information, the ratio to a third of the
               floor's creates/s at the same concurrency, which the API
               server, charging more for a status update than for a create,
               does not let even the writes alone reach.
  API requests what one Call costs the API server, counted by its
               apiserver_request_total over the sequential Calls of the
               latency run: writes and round trips by verb and resource,
               and behind them the requests it made to etcd
               (etcd_requests_total) and the watch events it sent
               (apiserver_watch_events_total). The same counts for every
               throughput run, a Call's beside the three writes': what ipc
               adds to the API server's work.

Every goal is printed with its figure and "met" or "missed".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if traced {
				p, stop, err := target.traced(cmd.Context())
				if err != nil {
					return err
				}
				defer stop()
				o.Tracing = p
			}
			return runBench(cmd, &target, func(ctx context.Context, cfg *rest.Config) (*bench.RoundTrip, error) {
				o.InProcess = target.kubeconfig == ""
				return bench.MeasureRoundTrip(ctx, cfg, o)
			}, printRoundTrip)
		},
	}
	target.flags(cmd)
	cmd.Flags().BoolVar(&traced, "tracing", false, "trace every Call as up does: the sender's, the receiver's and (embedded) kube-apiserver's spans, kept in memory as up's console keeps them and exported where OTEL_EXPORTER_OTLP_* say; compare with a run without it for what tracing costs")
	cmd.Flags().IntVar(&o.Samples, "samples", o.Samples, "sequential Calls for the latency measurement")
	cmd.Flags().IntVar(&o.Calls, "calls", o.Calls, "Calls per throughput level")
	cmd.Flags().IntSliceVar(&o.Senders, "senders", o.Senders, "concurrency levels for the throughput measurement")
	return cmd
}

func printRoundTrip(out io.Writer, rt *bench.RoundTrip) {
	printFloor(out, rt.Floor)
	fmt.Fprintln(out)
	if rt.Tracing {
		fmt.Fprintln(out, "every Call traced (--tracing): sender, receiver and kube-apiserver spans")
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "ipc.Call\tvalue\tratio to floor\tthree writes/s\tratio to them\t")
	fmt.Fprintf(tw, "latency p50 (ms)\t%.2f\t%.2f×\t\t\t\n", rt.Latency.P50, rt.P50Ratio)
	fmt.Fprintf(tw, "latency p99 (ms)\t%.2f\t%.2f×\t\t\t\n", rt.Latency.P99, rt.P99Ratio)
	senders := make([]int, 0, len(rt.CallsPerSec))
	for s := range rt.CallsPerSec {
		senders = append(senders, s)
	}
	slices.Sort(senders)
	for _, s := range senders {
		fmt.Fprintf(tw, "calls/s, %d senders\t%.0f\t%.2f\t%.0f\t%.2f\t\n", s, rt.CallsPerSec[s], rt.ThroughputRatio[s], rt.RequestWritesPerSec[s], rt.WritesRatio[s])
	}
	tw.Flush()
	fmt.Fprintln(out, "(calls/s ratio to floor: to the floor's creates/s ÷ 3, the writes a request makes, for information;")
	fmt.Fprintln(out, " three writes/s: create, status update and Event made back to back by as many writers, without ipc: the goal's floor)")
	fmt.Fprintln(out)
	printGoals(out, rt.Goals(), false)
	printAPIRequests(out, "call", rt.APIRequests)
	printThroughputRequests(out, senders, rt)
}

// printThroughputRequests sets what a Call cost the API server in each throughput run
// beside what the three writes without ipc cost it in theirs.
func printThroughputRequests(out io.Writer, senders []int, rt *bench.RoundTrip) {
	if len(rt.CallAPIRequests) == 0 {
		return
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "per request, in the throughput runs\tAPI requests\tof them writes\tetcd requests\twatch events sent\t")
	row := func(name string, r *bench.APIRequests) {
		if r != nil {
			fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\t\n", name, r.Writes+r.Reads, r.Writes, r.Etcd, r.WatchEvents)
		}
	}
	for _, s := range senders {
		row(fmt.Sprintf("ipc.Call, %d senders", s), rt.CallAPIRequests[s])
		row(fmt.Sprintf("three writes, %d writers", s), rt.WritesAPIRequests[s])
	}
	tw.Flush()
	fmt.Fprintln(out, "(counted as above; watch events: to every watcher of Books and Events, the receiver's informer and each Call's own watch among them)")
}

// runBench is the body of every bench subcommand: get the cluster to
// measure, measure it, print the table and write the JSON.
func runBench[T any](cmd *cobra.Command, target *benchTarget, measure func(context.Context, *rest.Config) (T, error), print func(io.Writer, T)) error {
	out := cmd.OutOrStdout()
	cfg, release, err := target.cluster(cmd.Context(), out)
	if err != nil {
		return err
	}
	defer release()
	// The bench's own goroutines (writers, watches, Calls) count as "bench", apart from the
	// components they measure, which carry labels of their own.
	var r T
	cpushare.Do("bench", func() { r, err = measure(cmd.Context(), cfg) })
	if err != nil {
		return err
	}
	print(out, r)
	return target.writeJSON(out, r)
}
