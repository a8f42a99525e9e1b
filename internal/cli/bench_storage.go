package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/crdipc/crdipc/internal/bench"
	"github.com/crdipc/crdipc/internal/services"
	"github.com/crdipc/crdipc/internal/simnode"
	"github.com/crdipc/crdipc/internal/storage/dataca"
)

func newBenchStorageCommand() *cobra.Command {
	var target benchTarget
	o := bench.DefaultStorageOptions
	nodes := 3
	cmd := &cobra.Command{
		Use:   "storage",
		Short: "Measure CStorVolume create → Ready through the operator and node agents",
		Long: `storage measures the storage system of seed 000 end to end: a CStorVolume is
created, the operator places its replicas, the node agents create them (sparse
files), the operator reports the volume Ready.

  create→Ready   one creator, volumes one after the other: p50/p99
  volumes/s      --creators concurrent creators, own connection each
  writes/volume  writes to volumes and replicas per volume, counted by the API
                 server (apiserver_request_total) over the volumes of
                 create→Ready; with them, every API request a volume costs, by
                 verb and resource

Ideals, from the floor measured first in the same run: a volume needs at least
1+RF creates and RF+1 status writes (each replica's Healthy, the volume's Ready); its critical path is four writes, each
seen through a watch (volume, replica, replica status, volume status). Ratios
to the ideal are printed (1 = ideal). Goal: create→Ready p50 ≤ 2× its ideal,
printed with "met" or "missed".

Without --kubeconfig, bench starts an embedded control plane plus, in this
process, the operator and --nodes simulated nodes with their agents, as
crdipc up does. With --kubeconfig, the operator and agents must already run
(e.g. crdipc up); a claim is created if there are fewer Healthy pools than
--replicas.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBench(cmd, &target, func(ctx context.Context, cfg *rest.Config) (*bench.Storage, error) {
				if target.kubeconfig == "" {
					stop, err := startStorage(ctx, cfg, nodes, "")
					if err != nil {
						return nil, err
					}
					defer func() { target.quiet(); stop() }()
				}
				o.InProcess = target.kubeconfig == ""
				return bench.MeasureStorage(ctx, cfg, o)
			}, printStorage)
		},
	}
	target.flags(cmd)
	cmd.Flags().IntVar(&o.Volumes, "volumes", o.Volumes, "volumes created one after the other for the latency")
	cmd.Flags().IntVar(&o.ThroughputVolumes, "throughput-volumes", o.ThroughputVolumes, "volumes created concurrently for the throughput")
	cmd.Flags().IntVar(&o.Creators, "creators", o.Creators, "concurrent creators for the throughput")
	cmd.Flags().Int32Var(&o.ReplicationFactor, "replicas", o.ReplicationFactor, "replication factor of every volume")
	cmd.Flags().IntVar(&nodes, "nodes", nodes, "simulated nodes to start (embedded control plane only)")
	return cmd
}

// startStorage runs the operator and simulated nodes in this process, as `up` does. The
// nodes' pools live under root, or, when root is "", under a temporary directory that stop
// removes.
func startStorage(ctx context.Context, cfg *rest.Config, nodes int, root string) (stop func(), err error) {
	cleanup := func() {}
	if root == "" {
		if root, err = os.MkdirTemp("", "crdipc-bench-storage-"); err != nil {
			return nil, err
		}
		cleanup = func() { os.RemoveAll(root) }
	}
	// The same entries as up and the standalone commands run, on one manager: the
	// operator, and a pool agent per simulated node with its pools under root.
	mgr, err := services.NewManager(cfg, "bench-storage", services.ManagerOptions{Repeatable: true})
	if err != nil {
		cleanup()
		return nil, err
	}
	if err := simnode.Add(mgr, simnode.Options{Nodes: nodes}); err != nil {
		cleanup()
		return nil, err
	}
	// One identity for everything here: bench measures speed, not permissions.
	local := &services.Local{DataDir: root, Nodes: nodes, Config: func(string) (*rest.Config, error) { return cfg, nil }}
	for _, name := range []string{"storage-operator", "pool-agent"} {
		e, _ := services.Lookup(name)
		if err := e.New().Setup(mgr, services.Env{Config: cfg, Local: local}); err != nil {
			cleanup()
			return nil, err
		}
	}
	// The agents request their data-path certificates as this one identity, which the
	// operator does not judge (it is no node's): approve our own requests, as the
	// administrator may.
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		cleanup()
		return nil, err
	}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error { return dataca.ApproveOwn(ctx, kube) })); err != nil {
		cleanup()
		return nil, err
	}
	stopMgr, err := services.Start(ctx, "storage", mgr)
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("storage services: %w", err)
	}
	return func() {
		stopMgr()
		cleanup()
	}, nil
}

func printStorage(out io.Writer, s *bench.Storage) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "storage (RF %d, %d Healthy pools)\tvalue\tideal\tratio\t\n", s.ReplicationFactor, s.Pools)
	fmt.Fprintf(tw, "create→Ready p50 (ms)\t%.1f\t%.1f\t%.1f×\t\n", s.CreateToReady.P50, s.IdealLatencyMs, s.P50Ratio)
	fmt.Fprintf(tw, "create→Ready p99 (ms)\t%.1f\t\t\t\n", s.CreateToReady.P99)
	fmt.Fprintf(tw, "volumes/s, %d creators\t%.1f\t%.1f\t%.1f×\t\n", s.Creators, s.VolumesPerSec, s.IdealVolumesPerSec, s.ThroughputRatio)
	fmt.Fprintf(tw, "writes/volume\t%.1f\t%d\t%.2f×\t\n", s.WritesPerVolume, s.IdealWrites, s.WritesRatio)
	tw.Flush()
	if len(s.Steps) > 0 {
		fmt.Fprintln(out)
		tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "create→Ready step by step, as the creator's watches saw it\tp50 (ms)\t")
		for _, st := range s.Steps {
			fmt.Fprintf(tw, "%s\t%.1f\t\n", st.Name, st.P50Ms)
		}
		tw.Flush()
		fmt.Fprintf(out, "(the ideal counts one create→watch, %.1f ms, for each of: the volume, its replicas, their status, its status)\n", s.IdealLatencyMs/4)
	}
	fmt.Fprintln(out)
	printGoals(out, s.Goals(), false)
	printAPIRequests(out, "volume", s.APIRequests)
	fmt.Fprintln(out)
	printFloor(out, s.Floor)
}
