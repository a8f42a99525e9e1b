package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"

	"github.com/crdipc/crdipc/internal/controlplane"
	"github.com/crdipc/crdipc/internal/services"
	"github.com/crdipc/crdipc/internal/tracing"
)

type upOptions struct {
	dataDir        string
	port           int
	metricsAddr    string
	healthAddr     string
	webhookAddr    string
	webhookOpsAddr string
	scmMetricsAddr string
	scmNamespace   string
	nodes          int
	// explicit holds the address flags the user set: a taken port fails them, while a
	// taken default falls back to a free port (up_ports.go).
	explicit map[string]bool
	// consoleAddr: the live console (up_console.go).
	consoleAddr string
	// otlpEndpoint: where every service and kube-apiserver export spans (OTLP), besides
	// the OTEL_EXPORTER_OTLP_* variables.
	otlpEndpoint string
	// tracing and traceStore are set by runUp: the services' tracer providers, and the
	// recent traces the console shows.
	tracing    *tracing.Provider
	traceStore *tracing.Store
	// services and disable pick entries of the service table.
	services, disable string
	// memoryLimit is the process's soft memory limit, as applied (memlimit.go).
	memoryLimit string
	// advertiseAddress is where pods and real nodes reach the API server (empty: loopback only).
	advertiseAddress string
}

func newUpCommand() *cobra.Command {
	o := upOptions{}
	var mem memoryLimit
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run a control plane and every crdipc service in this process",
		Long: `up starts, in this one process: etcd, kube-apiserver, kube-scheduler and the
kube-controller-manager controllers a cluster with nodes needs (garbage collector,
namespace, service accounts, PV binder and attach/detach, generic ephemeral volumes,
Deployment, ReplicaSet, DaemonSet, StatefulSet, Job, node lifecycle, endpoints, root CA
publisher, CSR signer), installs crdipc's CRDs, and starts crdipc's services. It prints
one line per step with its duration, then the "export KUBECONFIG=..." line to paste into
another terminal.

Every service is an entry of one table (--services picks entries, --disable leaves
some out; 'none' starts the control plane alone) and runs exactly as its own
subcommand would, on a manager of its own, as its own ServiceAccount with only the
role shipped in config/rbac: a token for each account is kept fresh under
<data-dir>/identities, next to a kubeconfig that uses it, so a service left out can
run as a process of its own. The simulated nodes act as their kubelets would, each as
system:node:<name>; the console reads as crdipc-console; up's admin credentials serve
only its own bootstrap:

  crdipc up --services=none
  crdipc books --kubeconfig .crdipc/identities/crdipc-system/crdipc-books.kubeconfig

There is no kubelet: --nodes simulated Nodes each run a pool agent (storage);
kube-scheduler binds their pods and a simulated kubelet runs them as local processes,
each on its own loopback IP. It runs the images it can: bitcoin/bitcoin and
btcsuite/btcd (the BitcoinNetwork operator's pods) as btcd, a Bitcoin node in Go
(go install github.com/btcsuite/btcd@v0.26.2), and busybox as the host's /bin/sh
and tools; other images wait with reason ImageNotSimulated. It mounts a pod's
PersistentVolumeClaims of StorageClass crdipc as kubelet does, through each node's
CSI node plugin (<data-dir>/csi/nodes/<node>/csi.sock: NodeStage, then NodePublish),
and runs a container with volumes in its own mount namespace, each volume at its
mountPath (a missing mountPath such as /data is created on this machine, empty,
while a pod uses it).

The driver's controller socket, <data-dir>/csi/csi.sock, relays Node calls to
node-1's plugin: CSI tools that dial one socket work as they are, e.g.
csi-sanity --csi.endpoint=unix://$PWD/.crdipc/csi/csi.sock (the node plugins also
accept paths under the system temp directory, where csi-sanity puts its own).

Volumes hold replicated data: each node's agent serves its replicas on a loopback
address of its own (mutual TLS), and a volume staged on a node is written to every
replica through a loop device over a FUSE file, acknowledged once its consistency
factor of replicas have it; a replica lost with its node is replaced and rebuilt.
This needs root (FUSE, loop devices, mounts).

Every address up serves is printed. A default address that is taken moves to a free
port on the same host; an address given by flag that is taken stops up.

Real nodes. A real kubelet (with containerd and kube-proxy) can join: start up
with --advertise-address set to an address of this machine that the node's pods
route to (the API server then also serves there, and the kubernetes Service points
to it), issue the node's credentials with 'crdipc kubeconfig --node NAME', and run
the kubelet with them; kube-scheduler places pods on simulated and real nodes alike,
and 'kubectl apply -k config/default' deploys crdipc itself onto real nodes.
hack/realnode.sh does all of it on this machine; see docs/deploy.md.

Every request is traced (OpenTelemetry): its W3C trace context travels on the
object (annotation tracing.k8s.io/traceparent) from the sender through
kube-apiserver to every receiver and the objects they create. The console keeps
the recent traces and draws a request's waterfall; it also receives OTLP/HTTP at
<console>/v1/traces, where 'crdipc call --trace' sends its own spans.
--otlp-endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT) exports every span to a
collector as well; see docs/architecture.md, "Tracing".

Everything is kept in --data-dir: run up again on the same directory and every
object is still there. Only one up may use a data directory at a time.
Ctrl-C shuts everything down.`,
		Example: `  crdipc up
  crdipc up --disable=nodes,bitcoin-operator
  crdipc up --data-dir ~/.local/share/crdipc --port 6443 --nodes 4
  crdipc up --services=none --nodes 0 --advertise-address 10.88.0.1   # for real nodes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			o.explicit = map[string]bool{}
			for _, f := range []string{"metrics-addr", "health-addr", "webhook-addr", "webhook-ops-addr", "scm-metrics-addr", "console-addr"} {
				o.explicit[f] = cmd.Flags().Changed(f)
			}
			var err error
			if o.memoryLimit, err = mem.apply(); err != nil {
				return err
			}
			return runUp(ctx, cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().StringVar(&o.dataDir, "data-dir", ".crdipc", "directory for etcd data, certificates, kubeconfig and logs")
	cmd.Flags().StringVar(&o.metricsAddr, "metrics-addr", "127.0.0.1:8080", "address for the services' Prometheus /metrics")
	cmd.Flags().StringVar(&o.healthAddr, "health-addr", "127.0.0.1:8081", "address for the services' /healthz and /readyz")
	cmd.Flags().StringVar(&o.webhookAddr, "webhook-addr", "127.0.0.1:8090", "address of the GitHub webhook listener (POST /webhook)")
	cmd.Flags().StringVar(&o.webhookOpsAddr, "webhook-ops-addr", "127.0.0.1:8091", "address of the webhook listener's /metrics, /healthz and /readyz, apart from /webhook")
	cmd.Flags().StringVar(&o.scmMetricsAddr, "scm-metrics-addr", "127.0.0.1:9102", "address of the SCM metrics agent's /metrics")
	cmd.Flags().StringVar(&o.scmNamespace, "scm-namespace", "default", "namespace for PullRequests, Branches and their Events")
	cmd.Flags().StringVar(&o.otlpEndpoint, "otlp-endpoint", "", "base URL of an OpenTelemetry collector (OTLP, e.g. http://127.0.0.1:4318) to export every service's and kube-apiserver's spans to; default: $OTEL_EXPORTER_OTLP_ENDPOINT (and the other OTEL_EXPORTER_OTLP_* variables); the console keeps the recent traces either way")
	cmd.Flags().StringVar(&o.consoleAddr, "console-addr", defaultConsoleAddr, "address of the live console, a web page of nodes, pools, replicas, volumes, requests, deliveries and networks (default taken: any free port on its host)")
	cmd.Flags().IntVar(&o.nodes, "nodes", 3, "simulated nodes, each with a pool agent and a file-backed pool root under --data-dir, running pods as processes")
	cmd.Flags().StringVar(&o.services, "services", "all", "services to run, comma-separated, from: "+strings.Join(services.Names(), ", ")+"; 'none' runs the control plane alone")
	cmd.Flags().StringVar(&o.disable, "disable", "", "services not to run, comma-separated (e.g. --disable=nodes,bitcoin-operator)")
	cmd.Flags().IntVar(&o.port, "port", 0, "API server port on 127.0.0.1 (0: the previous run's port if free, else a free one in 20000-29999, which the kernel hands to no other program while up is stopped)")
	cmd.Flags().StringVar(&o.advertiseAddress, "advertise-address", "", "an IP address of this machine on which the API server also serves (same port) and which the `kubernetes` Service points to, so that real nodes and their pods reach it (e.g. the pod network's bridge address; docs/deploy.md); empty: loopback only")
	mem.flag(cmd)
	return cmd
}

// upTraces is how many recent traces up keeps in memory for its console.
const upTraces = 200

func runUp(ctx context.Context, out io.Writer, o upOptions) error {
	start := time.Now()
	if err := services.Absolute(&o.dataDir); err != nil {
		return err
	}
	step := func(name string, took time.Duration) {
		fmt.Fprintf(out, "  %-28s %6.0f ms\n", name, float64(took.Microseconds())/1000)
	}
	fmt.Fprintf(out, "crdipc up: data dir %s\n", o.dataDir)
	if o.memoryLimit != "" {
		fmt.Fprintf(out, "  memory limit %s\n", o.memoryLimit)
	}
	var ids *upIdentities
	var advertise net.IP
	if o.advertiseAddress != "" {
		if advertise = net.ParseIP(o.advertiseAddress); advertise == nil {
			return fmt.Errorf("--advertise-address %q: not an IP address", o.advertiseAddress)
		}
	}
	// Traces: every service's and kube-apiserver's spans go to one bounded store, which
	// the console shows, and to an OTLP collector when one is configured.
	var err error
	o.traceStore = tracing.NewStore(upTraces, 0)
	o.tracing, err = tracing.New(ctx, tracing.Options{Endpoint: o.otlpEndpoint, Store: o.traceStore})
	if err != nil {
		return err
	}
	if !o.tracing.Enabled() {
		o.traceStore = nil // OTEL_SDK_DISABLED=true: the console says tracing is off
	}
	defer func() {
		if err := o.tracing.ShutdownWithin(5 * time.Second); err != nil {
			fmt.Fprintf(out, "tracing: %v\n", err)
		}
	}()
	cp, err := controlplane.Start(ctx, controlplane.Config{DataDir: o.dataDir, Port: o.port, Progress: step, CRDs: true,
		TracerProvider: o.tracing.APIServer(),
		Controllers:    controlplane.ClusterControllers, Scheduler: true, AdvertiseAddress: advertise,
		Install: func(ctx context.Context, admin *rest.Config, issue func(string, ...string) (*rest.Config, error)) (err error) {
			ids, err = installCluster(ctx, admin, issue, o)
			return err
		}})
	if err != nil {
		return err
	}
	defer func() {
		t := time.Now()
		if err := cp.Stop(); err != nil {
			fmt.Fprintf(out, "shutdown: %v\n", err)
		}
		fmt.Fprintf(out, "stopped in %.1f s\n", time.Since(t).Seconds())
	}()

	t := time.Now()
	svc, err := startServices(ctx, cp.NodeConfig, o, ids)
	if err != nil {
		return err
	}
	defer func() {
		if err := svc.stop(); err != nil {
			fmt.Fprintf(out, "services: %v\n", err)
		}
	}()
	step("services: "+strings.Join(svc.names, ", "), time.Since(t))

	fmt.Fprintf(out, "crdipc is up in %.2f s; API server %s\n\n", time.Since(start).Seconds(), cp.URL)
	if cp.AdvertiseURL != "" {
		fmt.Fprintf(out, "  nodes    reach the API server at %s (join one: docs/deploy.md)\n", cp.AdvertiseURL)
	}
	for _, l := range svc.lines {
		fmt.Fprintf(out, "  %s\n", l)
	}
	fmt.Fprintf(out, "  logs     %s\n\n", filepath.Join(cp.DataDir(), "logs"))
	fmt.Fprintf(out, "export KUBECONFIG=%s\n\n", cp.Kubeconfig)
	fmt.Fprintln(out, "Ctrl-C to stop.")
	<-ctx.Done()
	fmt.Fprintln(out, "\nshutting down")
	return nil
}
