package driver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// metrics are the driver's own: one histogram of every CSI call by method and gRPC code,
// named like the CSI sidecars' csi_sidecar_operations_seconds so the same dashboards read
// both sides of the socket.
type metrics struct {
	operations *prometheus.HistogramVec
	takeovers  prometheus.Counter
	localLinks *prometheus.CounterVec
	localReads *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{operations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "crdipc_csi_operations_seconds",
		Help:    "CSI calls served by the crdipc driver, by method and gRPC status code, and how long they took.",
		Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"method", "grpc_status_code"})}
	var err error
	if m.operations, err = register(reg, m.operations); err != nil {
		return nil, err
	}
	m.takeovers, err = register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "crdipc_csi_volume_takeovers_total",
		Help: "Staged volumes this node plugin served again after an earlier process of it stopped or died, their FUSE connection kept by the fd holder.",
	}))
	if err != nil {
		return nil, err
	}
	m.localLinks, err = register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "crdipc_csi_local_replica_connections_total",
		Help: "Connections the targets of this node plugin opened to the replica on their own node, by link: socket (the pool agent's local socket, no TLS) or tls (the socket could not be used; the plugin logs why).",
	}, []string{"link"}))
	if err != nil {
		return nil, err
	}
	m.localReads, err = register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "crdipc_csi_local_replica_sessions_total",
		Help: "Writer sessions the targets of this node plugin opened over the local socket on the replica on their own node, by how they read it: file (a read-only descriptor of the replica's file the pool agent handed over, one pread a read) or socket (the agent could not hand it; the plugin logs why).",
	}, []string{"reads"}))
	if err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the collector registered before it: a second driver in
// one process (tests, or up restarted in-process) shares the first one's series.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return c, fmt.Errorf("registering csi driver metrics: %w", err)
		}
		return are.ExistingCollector.(C), nil
	}
	return c, nil
}

// intercept logs and measures each call.
func (d *Driver) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	took := time.Since(start)
	d.metrics.operations.WithLabelValues(path.Base(info.FullMethod), status.Code(err).String()).Observe(took.Seconds())
	if err != nil {
		d.log.V(1).Info("call failed", "method", info.FullMethod, "duration", took, "error", err.Error())
	} else {
		d.log.V(2).Info("call", "method", info.FullMethod, "duration", took)
	}
	return resp, err
}

// Handler serves the driver's HTTP endpoints: /healthz (the process answers), /readyz (the
// CSI Probe: the API server answers and the driver may list CStorVolumes; 503 with the
// reason otherwise, and while it gets ready to take over from a predecessor) and /metrics from gatherer.
func (d *Driver) Handler(gatherer prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if d.preparing.Load() {
			http.Error(w, "not ready: getting ready to take this node's volumes over from the process that serves them (waiting for the data-path certificate)", http.StatusServiceUnavailable)
			return
		}
		resp, err := d.Probe(r.Context(), &csi.ProbeRequest{})
		if err == nil && resp.GetReady().GetValue() {
			fmt.Fprintln(w, "ok")
			return
		}
		http.Error(w, "not ready: the driver cannot list CStorVolumes (API server unreachable, CRD not served, or no permission); see its log", http.StatusServiceUnavailable)
	})
	mux.Handle("/metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	return mux
}
