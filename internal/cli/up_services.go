package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/crdipc/crdipc/internal/bitcoin"
	"github.com/crdipc/crdipc/internal/bitcoin/btcd"
	"github.com/crdipc/crdipc/internal/books"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/nodeservice"
	"github.com/crdipc/crdipc/internal/podsim"
	"github.com/crdipc/crdipc/internal/podsim/busybox"
	"github.com/crdipc/crdipc/internal/scm/metricsagent"
	"github.com/crdipc/crdipc/internal/scm/webhook"
	"github.com/crdipc/crdipc/internal/storage/agent"
	"github.com/crdipc/crdipc/internal/storage/operator"
	"github.com/crdipc/crdipc/ipc"
)

// upServices are the crdipc services `up` runs in-process. The controllers
// share one manager: one process has nothing to elect a leader against.
type upServices struct {
	names []string
	// lines are what up prints about the services: addresses, secrets.
	lines  []string
	cancel context.CancelFunc
	done   []chan error
	// first stop before the others, in order, each returning its service's error.
	first []func() error
	// after run once every service has stopped.
	after []func()
	log   io.Closer
}

// stop ends every service and waits for them.
func (s *upServices) stop() error {
	var errs []error
	for _, f := range s.first {
		errs = append(errs, f())
	}
	s.cancel()
	for _, d := range s.done {
		errs = append(errs, <-d)
	}
	for _, f := range s.after {
		f()
	}
	s.log.Close()
	return errors.Join(errs...)
}

func (s *upServices) run(ctx context.Context, run func(context.Context) error) {
	d := make(chan error, 1)
	s.done = append(s.done, d)
	go func() { d <- run(ctx) }()
}

// runFirst runs a service that stop ends, and waits for, before all the others.
func (s *upServices) runFirst(run func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	d := make(chan error, 1)
	go func() { d <- run(ctx) }()
	s.first = append(s.first, func() error { cancel(); return <-d })
}

func startServices(ctx context.Context, cfg *rest.Config, o upOptions) (_ *upServices, err error) {
	logFile, err := os.OpenFile(filepath.Join(o.dataDir, "logs", "crdipc.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening service log: %w", err)
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logFile), zap.Level(zapcore.InfoLevel)))
	slogger := slog.New(slog.NewJSONHandler(logFile, nil))

	runCtx, cancel := context.WithCancel(context.Background())
	svc := &upServices{cancel: cancel, log: logFile}
	defer func() {
		if err != nil {
			_ = svc.stop()
		}
	}()

	// Bind every port first: a port the user chose that is in use fails up at once, with
	// its name; a default one that is taken moves to a free port, which up prints.
	webhookLn, err := listenOrAny("webhook listener", o.webhookAddr, o.explicit["webhook-addr"])
	if err != nil {
		return nil, err
	}
	agentLn, err := listenOrAny("metrics agent", o.scmMetricsAddr, o.explicit["scm-metrics-addr"])
	if err != nil {
		webhookLn.Close()
		return nil, err
	}

	mgr, err := newManager(cfg, "up", serviceOptions{metricsAddr: o.metricsAddr, healthAddr: o.healthAddr})
	if err != nil {
		webhookLn.Close()
		agentLn.Close()
		return nil, err
	}
	if err := books.Register(mgr, ipc.Options{}); err != nil {
		return nil, err
	}
	svc.names = append(svc.names, "books")

	// Storage (seed 000): the operator, and one pool agent per simulated
	// node, each with a real file backend under the data dir.
	if err := operator.Register(mgr, operator.Options{}); err != nil {
		return nil, err
	}
	nodesRoot := filepath.Join(o.dataDir, "nodes")
	if _, err := agent.AddSupervisor(mgr, cfg, agent.SupervisorOptions{Nodes: o.nodes, Root: nodesRoot}); err != nil {
		return nil, err
	}
	svc.names = append(svc.names, "storage-operator", fmt.Sprintf("%d pool agents", o.nodes))
	svc.lines = append(svc.lines, fmt.Sprintf("nodes    %d simulated (label a Node %s=true to add one), pools under %s", o.nodes, agent.SimulatedLabel, nodesRoot))

	// CSI (seed 001): driver and sidecar in this process, over a real socket. The
	// driver also serves node-1's Node service; every other simulated node gets an
	// instance of its own, started when the simulated kubelet first mounts a volume there.
	csiDriver, serveDriver, csiEndpoint, err := startCSI(ctx, cfg, mgr, o.dataDir, "node-1")
	if err != nil {
		return nil, err
	}
	svc.run(runCtx, serveDriver)
	csiNodes, err := nodeservice.New(nodeservice.Options{Config: cfg, Dir: filepath.Join(o.dataDir, "csi"), Drivers: map[string]*driver.Driver{"node-1": csiDriver}})
	if err != nil {
		return nil, err
	}
	// After the manager: the kubelet unstages every volume when it stops, through these.
	svc.after = append(svc.after, csiNodes.Stop)

	// Bitcoin (seed 002): the operator, and the simulated nodes' kubelet that runs the
	// pods of its StatefulSets, bitcoin/bitcoin as btcd processes, busybox pods with the
	// host's tools, and mounts their PersistentVolumeClaims through the CSI driver.
	if err := bitcoin.Add(mgr, bitcoin.Options{}); err != nil {
		return nil, err
	}
	btcdImage := btcd.Image{}
	podsRoot := filepath.Join(o.dataDir, "pods")
	// The kubelet has a manager of its own, stopped before the others: stopping, it
	// unstages every volume, which closes the replicas through the pool agents' data
	// services, so those must still run.
	podMgr, err := newManager(cfg, "up-pods", serviceOptions{metricsAddr: "0", healthAddr: "0"})
	if err != nil {
		return nil, err
	}
	// Ctrl-C must end up within seconds: processes get 2 s after SIGTERM.
	if err := podsim.Add(podMgr, podsim.Options{
		Root:        podsRoot,
		Images:      map[string]podsim.Image{"bitcoin/bitcoin": btcdImage, busybox.Name: busybox.Image{}},
		StopTimeout: 2 * time.Second,
		CSI:         csiNodes.Client,
		CSIDriver:   driver.Name,
	}); err != nil {
		return nil, err
	}
	svc.names = append(svc.names, "bitcoin-operator", "pod runtime")
	podsNote := "bitcoin/bitcoin runs as btcd"
	if _, err := btcdImage.Find(); err != nil {
		podsNote = "bitcoin/bitcoin cannot run: btcd is not installed (go install " + btcd.Module + ")"
	}
	svc.lines = append(svc.lines, fmt.Sprintf("pods     run on the simulated nodes under %s; %s; busybox runs the host's sh and tools", podsRoot, podsNote))
	svc.names = append(svc.names, "csi-driver", "csi-sidecar")
	svc.lines = append(svc.lines, "csi      "+csiEndpoint+"   (StorageClass "+StorageClassName+")")
	svc.run(runCtx, mgr.Start)
	svc.runFirst(podMgr.Start)

	secretPath := filepath.Join(o.dataDir, "webhook-secret")
	secret, created, err := webhook.EnsureSecretFile(secretPath)
	if err != nil {
		webhookLn.Close()
		agentLn.Close()
		return nil, err
	}
	listener, err := webhook.New(webhook.Options{Config: cfg, Namespace: o.scmNamespace, Secret: secret, Logger: slogger.With("service", "webhook-listener")})
	if err != nil {
		webhookLn.Close()
		agentLn.Close()
		return nil, err
	}
	svc.run(runCtx, func(ctx context.Context) error { return listener.Serve(ctx, webhookLn) })
	svc.names = append(svc.names, "webhook-listener")
	secretNote := "secret in " + secretPath
	if created {
		secretNote = "new secret " + string(secret) + " in " + secretPath
	}
	svc.lines = append(svc.lines, fmt.Sprintf("webhook  http://%s/webhook   (%s)", webhookLn.Addr(), secretNote))

	agent, err := metricsagent.New(metricsagent.Options{Config: cfg, Namespace: o.scmNamespace, Logger: slogger.With("service", "metrics-agent")})
	if err != nil {
		agentLn.Close()
		return nil, err
	}
	svc.run(runCtx, func(ctx context.Context) error { return agent.Serve(ctx, agentLn) })
	svc.names = append(svc.names, "metrics-agent")
	svc.lines = append(svc.lines, fmt.Sprintf("scm      http://%s/metrics   (metrics agent: PullRequest/Branch Events and gauges)", agentLn.Addr()))

	if err := startConsole(runCtx, cfg, o, svc); err != nil {
		return nil, err
	}

	if !mgr.GetCache().WaitForCacheSync(ctx) || !podMgr.GetCache().WaitForCacheSync(ctx) {
		return nil, fmt.Errorf("services: informer caches did not sync")
	}
	return svc, nil
}
