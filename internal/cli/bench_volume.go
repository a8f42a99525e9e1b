package cli

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"

	"github.com/crdipc/crdipc/internal/bench"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/mountinfo"
	"github.com/crdipc/crdipc/internal/services"
)

func newBenchVolumeCommand() *cobra.Command {
	var target benchTarget
	o := bench.DefaultVolumeOptions
	nodes := 3
	dir := ""
	other, runs := "", 5
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Measure a replicated volume's data path against a local file, with fio",
		Long: `volume measures the data path of a replicated volume — file system, loop
device, FUSE file, volume target, replicas over mutual TLS — with fio, and runs
the same fio jobs on a plain file in a plain directory of the same disk, in the
same run; the figures are reported as ratios volume/local. The replicas share
the local file's disk, so a write reaches it once per replica: the write goals
are ratios to the local file's figure ÷ --replicas, what a write can have.

  seq write    1 MiB writes, --seq-iodepth in flight, --seq-size, end_fsync
               (the final fsync counts): goal ≥ 0.8 of local ÷ replicas
  seq read     the same file read back, from the disk: goal ≥ 0.8 of local
  rand write   4 KiB writes over --rand-size, --rand-iodepth in flight, for
               --rand-runtime: IOPS, goal ≥ 0.5 of local ÷ replicas; and the
               CPU per write, goal ≤ 7.2 × the local file's
  rebuild      a second volume (--rebuild-size) gets --rebuild-data bytes
               written to its block device and is unstaged; then one replica is
               rebuilt from another: allocated MiB copied per second (goal ≥ 100)

The volume is created with CreateVolume on the CSI driver's socket, staged
(--fs-type) and published with NodeStageVolume and NodePublishVolume. Jobs use
O_DIRECT (libaio) where the disk takes it; with --drop-caches (root) the page
cache is emptied before reads and the rebuild, so that replicas read from the
disk as the local file does. Each job runs --rounds times on each side, the
two taking turns, and its ratio is the median round's: the disk of a shared
machine drifts by a third from one minute to the next. Each job then runs once
more on a file system on crdipc's block export (FUSE file, loop device) of a
device held in memory: the ceiling of the layers every volume goes through,
with no replica behind them. Goals are reported ("met" or "missed"), not
enforced.

The CPU of a request is the whole machine's busy time (/proc/stat: user, system,
interrupts; not idle, I/O wait or steal) while fio ran the job, over the job's
requests: fio, the kernel's file system, loop and FUSE layers, the volume target
and the replica servers alike. It is the data path's cost on a machine that runs
nothing else; with --kubeconfig, replicas on other machines are not in it. The
ceiling's CPU per request is reported beside it: what FUSE, the loop device and
the file system cost a request with no replica behind them, the frontend's share
of a volume's request (the ceiling runs each job once, so its short sequential
jobs are noisy: read the random write's, which runs --rand-runtime).

Without --kubeconfig, bench starts an embedded control plane plus, in this
process, the operator, --nodes simulated nodes with their agents and the CSI
driver serving node-1, with the pools and the local file under --dir. With
--kubeconfig, --endpoint names a running driver's socket whose Node service
serves a node of the cluster (crdipc up: <data-dir>/csi/csi.sock), and --dir
should be on the disk of that node's pools. Needs fio (apt-get install fio),
/dev/fuse, loop devices and mount privilege.

With --binary, bench compares two builds instead: it runs "bench volume" of this
binary and of --binary in turn, --runs times each, with the same flags, and
prints each job's median volume/local ratio for both and their quotient, and the
random write's CPU per request over the local file's where both builds measure
it, with the p-value of a Mann-Whitney U test of the two builds' runs (as
benchstat's). It fails if a median ratio is more than 10 % below the other
build's, or the CPU ratio more than 10 % above, and the U test says the runs
differ (p ≤ 0.05); it names those better the same way. On a shared machine
single runs of one build differ by up to 3x, so one run against another says
nothing, and two medians of noisy runs can differ by chance; the test needs at
least 5 runs each (with fewer, the medians decide alone, as it says).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if other != "" {
				if runs < 1 {
					return fmt.Errorf("--runs %d: want at least 1", runs)
				}
				return runVolumeAB(cmd, other, runs)
			}
			return runBench(cmd, &target, func(ctx context.Context, cfg *rest.Config) (*bench.Volume, error) {
				work, err := os.MkdirTemp(dir, "crdipc-bench-volume-")
				if err != nil {
					return nil, err
				}
				defer removeUnmounted(cmd.ErrOrStderr(), work)
				o.Dir = work
				if target.kubeconfig == "" {
					stop, endpoint, err := startVolumeServices(ctx, cfg, nodes, work, cmd.ErrOrStderr())
					if err != nil {
						return nil, err
					}
					defer func() { target.quiet(); stop() }()
					o.Endpoint = endpoint
				} else if o.Endpoint == "" {
					return nil, errors.New("--endpoint is required with --kubeconfig: the socket of a CSI driver serving a node of that cluster")
				}
				return bench.MeasureVolume(ctx, cfg, o)
			}, printVolume)
		},
	}
	target.flags(cmd)
	f := cmd.Flags()
	f.StringVar(&o.Endpoint, "endpoint", "", "CSI driver socket (unix://…) to measure through (with --kubeconfig)")
	f.StringVar(&dir, "dir", "", "directory for the local file, the mounts and, without --kubeconfig, the pools (default $TMPDIR)")
	f.StringVar(&o.Fio, "fio", o.Fio, "fio binary")
	f.StringVar(&o.FsType, "fs-type", o.FsType, "file system of the measured volume")
	f.IntVar(&o.ReplicationFactor, "replicas", o.ReplicationFactor, "replication factor of the volumes")
	f.IntVar(&nodes, "nodes", nodes, "simulated nodes to start (embedded control plane only)")
	f.Var(bytesFlag{&o.VolumeSize}, "volume-size", "size of the measured volume")
	f.Var(bytesFlag{&o.SeqSize}, "seq-size", "file size of the sequential jobs")
	f.IntVar(&o.SeqIODepth, "seq-iodepth", o.SeqIODepth, "1 MiB requests in flight in the sequential jobs")
	f.Var(bytesFlag{&o.RandSize}, "rand-size", "file size of the random-write job")
	f.DurationVar(&o.RandRuntime, "rand-runtime", o.RandRuntime, "how long the random-write job runs")
	f.IntVar(&o.RandIODepth, "rand-iodepth", o.RandIODepth, "4 KiB requests in flight in the random-write job")
	f.Var(bytesFlag{&o.RebuildSize}, "rebuild-size", "size of the volume whose replica is rebuilt")
	f.Var(bytesFlag{&o.RebuildData}, "rebuild-data", "bytes written to it before the rebuild")
	f.BoolVar(&o.DropCaches, "drop-caches", o.DropCaches, "empty the page cache before reads and the rebuild (needs root)")
	f.StringVar(&other, "binary", "", "another crdipc build to compare with: run both builds' bench volume in turn (--runs each) and compare the medians")
	f.IntVar(&runs, "runs", runs, "with --binary: runs of each build")
	f.IntVar(&o.Rounds, "rounds", o.Rounds, "runs of each job on each side, taking turns; the ratio is the median round's (a shared machine's disk drifts between runs)")
	return cmd
}

// bytesFlag is a size in Kubernetes quantity notation (512Mi, 2Gi).
type bytesFlag struct{ p *int64 }

func (f bytesFlag) String() string {
	if f.p == nil {
		return "0"
	}
	return resource.NewQuantity(*f.p, resource.BinarySI).String()
}

func (f bytesFlag) Set(s string) error {
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return err
	}
	if q.Value() <= 0 {
		return fmt.Errorf("%s: want a positive size", s)
	}
	*f.p = q.Value()
	return nil
}

func (bytesFlag) Type() string { return "quantity" }

// startVolumeServices runs in this process what bench storage runs, with the nodes' pools
// under root (on the disk of the local-file baseline), and the CSI driver serving node-1 on
// a socket under root. stop tells report (if not nil) how node-1's target reached the
// replica on its node: the link a run measured.
func startVolumeServices(ctx context.Context, cfg *rest.Config, nodes int, root string, report io.Writer) (stop func(), endpoint string, err error) {
	storageDir := filepath.Join(root, "nodes")
	stopStorage, err := startStorage(ctx, cfg, nodes, storageDir)
	if err != nil {
		return nil, "", err
	}
	endpoint, err = driver.Endpoint(filepath.Join(root, "csi.sock"))
	if err != nil {
		stopStorage()
		return nil, "", err
	}
	// A registry of its own: the driver's metrics are not served here.
	// Staging and target paths are under root too: it is the kubelet root.
	// node-1's target reaches the replica on node-1 as a node plugin does: over its pool
	// agent's local socket.
	reg := prometheus.NewRegistry()
	d, err := driver.New(driver.Options{Config: cfg, NodeID: "node-1", TargetDir: filepath.Join(root, "targets"), KubeletRoot: root, Registerer: reg,
		LocalReplicaSocket: services.LocalReplicaSocket(storageDir, "node-1")})
	if err != nil {
		stopStorage()
		return nil, "", err
	}
	l, err := driver.Listen(endpoint)
	if err != nil {
		stopStorage()
		return nil, "", err
	}
	dctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.ServeListener(dctx, l) }()
	return func() {
		cancel()
		<-done
		stopStorage()
		if report != nil {
			links := map[string]map[string]float64{"link": {}, "reads": {}}
			if mfs, err := reg.Gather(); err == nil {
				for _, mf := range mfs {
					switch mf.GetName() {
					case "crdipc_csi_local_replica_connections_total", "crdipc_csi_local_replica_sessions_total":
					default:
						continue
					}
					for _, m := range mf.GetMetric() {
						for _, l := range m.GetLabel() {
							if by := links[l.GetName()]; by != nil {
								by[l.GetValue()] += m.GetCounter().GetValue()
							}
						}
					}
				}
			}
			fmt.Fprintf(report, "bench: node-1's target reached the replica on its node %v times over the local socket, %v over TLS; it read it through its file in %v sessions, over the socket in %v\n",
				links["link"]["socket"], links["link"]["tls"], links["reads"]["file"], links["reads"]["socket"])
		}
	}, endpoint, nil
}

// removeUnmounted removes dir unless something is still mounted under it (a volume the
// benchmark failed to unpublish): RemoveAll would descend into the mount.
func removeUnmounted(warn io.Writer, dir string) {
	if m := mountUnder(dir); m != "" {
		fmt.Fprintf(warn, "bench: leaving %s: %s is still mounted\n", dir, m)
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintf(warn, "bench: %v\n", err)
	}
}

// mountUnder returns a mount point under dir from this process's mount table, or "".
func mountUnder(dir string) string {
	f, err := os.Open(mountinfo.Self)
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		// Field 5 is the mount point, with spaces and the like octal-escaped.
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			return fields[4]
		}
	}
	return ""
}

func printVolume(out io.Writer, v *bench.Volume) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	mode := "buffered"
	if v.Direct {
		mode = "O_DIRECT"
	}
	if v.CachesDropped {
		mode += ", caches dropped"
	}
	fmt.Fprintf(tw, "volume (RF %d, %s, %s; fio %s, %s)\tvolume\tlocal file\tratio\trounds\tceiling\tvolume/ceiling\tCPU µs/request: volume\tlocal\tratio\tceiling\t\n",
		v.ReplicationFactor, v.FsType, resource.NewQuantity(v.VolumeBytes, resource.BinarySI), v.Engine, mode)
	for _, j := range v.Jobs {
		value := func(r bench.FioResult) string {
			if j.Metric == "IOPS" {
				return fmt.Sprintf("%.0f", r.IOPS)
			}
			return fmt.Sprintf("%.1f", r.MiBPerSec)
		}
		rounds := make([]string, len(j.Rounds))
		for i, r := range j.Rounds {
			rounds[i] = fmt.Sprintf("%.2f", r)
		}
		ceiling, vsCeiling := "", ""
		if j.Ceiling != nil {
			ceiling, vsCeiling = value(*j.Ceiling), fmt.Sprintf("%.2f", j.CeilingRatio)
		}
		cpu := "\t\t\t"
		if j.CPURatio > 0 {
			cpu = fmt.Sprintf("%.0f\t%.0f\t%.1f\t", j.Volume.CPUPerOpMicros, j.Local.CPUPerOpMicros, j.CPURatio)
			if j.Ceiling != nil && j.Ceiling.CPUPerOpMicros > 0 {
				cpu += fmt.Sprintf("%.0f", j.Ceiling.CPUPerOpMicros)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%s\t%s\t%s\t%s\t\n", j.Description, value(j.Volume), value(j.Local), j.Ratio,
			strings.Join(rounds, " "), ceiling, vsCeiling, cpu)
	}
	r := v.Rebuild
	fmt.Fprintf(tw, "rebuild, %.0f of %.0f MiB allocated (MiB/s)\t%.1f\t\t\t\t\t\t\t\t\t\t\n",
		float64(r.AllocatedBytes)/(1<<20), float64(r.VolumeBytes)/(1<<20), r.MiBPerSec)
	tw.Flush()
	fmt.Fprintln(out, "(ratio: the median of the rounds' volume/local, each round running both sides in turn;")
	fmt.Fprintln(out, " ceiling: the same job on crdipc's FUSE and loop export of a device in memory, no replicas;")
	fmt.Fprintln(out, " CPU µs/request: the whole machine's busy CPU while the job ran, over its requests, in the median round;")
	fmt.Fprintln(out, " its ceiling: the same on the ceiling's export, what FUSE, loop and the file system cost with no replica)")
	fmt.Fprintln(out)
	printGoals(out, v.Goals(), false)
}
