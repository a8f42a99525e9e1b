package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"

	"github.com/go-logr/logr"
	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	snapclientset "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/crdipc/crdipc/internal/cpushare"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/identity"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/safefile"
	"github.com/crdipc/crdipc/internal/services"
)

// upServices are the entries of the service table up runs in-process, each on a manager of
// its own, acting as its own ServiceAccount with its shipped role, exactly as on a cluster.
type upServices struct {
	names []string
	// lines are what up prints about the services: addresses, secrets.
	lines []string
	// running, in start order; stop stops them in reverse.
	running []*upService
	// background are up's own servers (metrics, probes, console) and the token keeper.
	cancel context.CancelFunc
	done   []chan error
	log    io.Closer
}

type upService struct {
	name   string
	mgr    manager.Manager
	svc    services.Service
	cancel context.CancelFunc
	done   chan error
}

// stop ends every service, the last started first (the simulated nodes unstage their
// volumes while the storage services still run), then up's own servers.
func (s *upServices) stop() error {
	var errs []error
	for i := len(s.running) - 1; i >= 0; i-- {
		r := s.running[i]
		r.cancel()
		if err := <-r.done; err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.name, err))
		}
		services.Stop(r.svc)
	}
	s.cancel()
	for _, d := range s.done {
		errs = append(errs, <-d)
	}
	s.log.Close()
	return errors.Join(errs...)
}

func (s *upServices) background(ctx context.Context, run func(context.Context) error) {
	d := make(chan error, 1)
	s.done = append(s.done, d)
	go func() { d <- run(ctx) }()
}

// upListener binds the listeners of up's services: the flags name their addresses.
func upListener(o upOptions) func(name, addr string) (net.Listener, error) {
	return func(name, addr string) (net.Listener, error) {
		flag := ""
		switch name {
		case "webhook listener":
			addr, flag = o.webhookAddr, "webhook-addr"
		case "webhook listener ops":
			addr, flag = o.webhookOpsAddr, "webhook-ops-addr"
		case "metrics agent":
			addr, flag = o.scmMetricsAddr, "scm-metrics-addr"
		}
		return listenOrAny(name, addr, o.explicit[flag])
	}
}

// startServices starts the selected services and up's own servers. None of them acts as
// up's admin: each service and the console as its own ServiceAccount, the simulated nodes
// each as its kubelet, with the config kubelet returns.
func startServices(ctx context.Context, kubelet func(node string) (*rest.Config, error), o upOptions, ids *upIdentities) (_ *upServices, err error) {
	entries, err := services.Select(o.services, o.disable)
	if err != nil {
		return nil, err
	}
	logFile, err := safefile.OpenFile(filepath.Join(o.dataDir, "logs", "crdipc.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening service log: %w", err)
	}
	logger := slog.New(slog.NewJSONHandler(logFile, nil))
	ctrllog.SetLogger(logr.FromSlogHandler(logger.Handler()))

	bgCtx, cancel := context.WithCancel(context.Background())
	svc := &upServices{cancel: cancel, log: logFile}
	defer func() {
		if err != nil {
			_ = svc.stop()
		}
	}()

	// Bind up's own ports first: a port the user chose that is in use fails up at once,
	// with its name; a default one that is taken moves to a free port, which up prints.
	metricsLn, err := listenOrAny("metrics", o.metricsAddr, o.explicit["metrics-addr"])
	if err != nil {
		return nil, err
	}
	healthLn, err := listenOrAny("health probes", o.healthAddr, o.explicit["health-addr"])
	if err != nil {
		metricsLn.Close()
		return nil, err
	}
	healthServed := false
	defer func() {
		if err != nil && !healthServed {
			healthLn.Close()
		}
	}()
	checks := map[string]healthz.Checker{"ping": healthz.Ping}
	health := http.NewServeMux()
	health.Handle("/healthz", &healthz.Handler{Checks: map[string]healthz.Checker{"ping": healthz.Ping}})
	ready := http.StripPrefix("/readyz", &healthz.Handler{Checks: checks})
	health.Handle("/readyz", ready)
	health.Handle("/readyz/", ready)
	metrics := http.NewServeMux()
	metrics.Handle("/metrics", promhttp.HandlerFor(ctrlmetrics.Registry, promhttp.HandlerOpts{}))
	svc.background(bgCtx, (&services.HTTPServer{Name: "metrics", Listener: metricsLn, Handler: metrics}).Start)
	svc.lines = append(svc.lines, fmt.Sprintf("metrics  http://%s/metrics   health http://%s/readyz", metricsLn.Addr(), healthLn.Addr()))

	keeper, namespaces, configs, idDir := ids.keeper, ids.namespaces, ids.configs, ids.dir
	configFor := func(service string) (*rest.Config, error) {
		cfg, ok := configs[service]
		if !ok {
			return nil, fmt.Errorf("no identity for service %q", service)
		}
		return rest.CopyConfig(cfg), nil
	}
	svc.background(bgCtx, func(ctx context.Context) error { keeper.Run(ctx); return nil })
	svc.lines = append(svc.lines, fmt.Sprintf("accounts one ServiceAccount and kubeconfig per service under %s", idDir))

	local := &services.Local{
		DataDir:      o.dataDir,
		Nodes:        o.nodes,
		SCMNamespace: o.scmNamespace,
		Listen:       upListener(o),
		Config:       configFor,
		NodeConfig: func(service, node string) (*rest.Config, error) {
			cfg, err := keeper.NodeConfig(ctx, namespaces[service], identity.ServiceAccount(service), node)
			if err != nil {
				return nil, err
			}
			services.Unthrottle(cfg)
			return cfg, nil
		},
		KubeletConfig: kubelet,
		Say:           func(l string) { svc.lines = append(svc.lines, l) },
	}
	for _, e := range entries {
		cfg, err := configFor(e.Name)
		if err != nil {
			return nil, err
		}
		s := e.New()
		env := services.Env{Logger: logger.With("service", e.Name), Local: local, Tracing: o.tracing}
		mgr, err := services.Build(cfg, e, s, services.ManagerOptions{Repeatable: true}, env)
		if err != nil {
			return nil, err
		}
		mctx, cancel := context.WithCancel(context.Background())
		r := &upService{name: e.Name, mgr: mgr, svc: s, cancel: cancel, done: make(chan error, 1)}
		cpushare.Do(e.Name, func() {
			go func() { r.done <- mgr.Start(mctx) }()
		})
		svc.running = append(svc.running, r)
		svc.names = append(svc.names, e.Name)
		checks[e.Name] = func(req *http.Request) error {
			if !mgr.GetCache().WaitForCacheSync(req.Context()) {
				return errors.New("informer caches not synced")
			}
			return nil
		}
	}

	// The probes are served only once every service's check is in the map, which the
	// handler reads without a lock (a probe during start-up would race the writes above).
	// Until then the bound port queues them.
	svc.background(bgCtx, (&services.HTTPServer{Name: "health probes", Listener: healthLn, Handler: health}).Start)
	healthServed = true

	consoleCfg, err := configFor("console")
	if err != nil {
		return nil, err
	}
	if err := startConsole(bgCtx, consoleCfg, o, svc); err != nil {
		return nil, err
	}
	for _, r := range svc.running {
		if !r.mgr.GetCache().WaitForCacheSync(ctx) {
			return nil, fmt.Errorf("services: %s: informer caches did not sync", r.name)
		}
	}
	if len(svc.names) == 0 {
		svc.names = []string{"none"}
	}
	return svc, nil
}

// upIdentities are every service's ServiceAccount, role and token, made before the
// services start.
type upIdentities struct {
	keeper     *identity.Keeper
	namespaces map[string]string       // of each account
	configs    map[string]*rest.Config // a client config with each account's token
	dir        string
}

// installCluster is what up installs into the cluster besides the CRDs: every service's
// identity, selected or not (a service left out of up can run as a process of its own with
// the kubeconfig up keeps for it), the console's, and the StorageClass. The control plane
// runs it while the API server finishes its first-start bootstrap. The token keeper, which
// runs as long as up, acts as identity.KeeperUser (credentials from issue), allowed only to
// request these accounts' tokens.
func installCluster(ctx context.Context, admin *rest.Config, issue func(string, ...string) (*rest.Config, error), o upOptions) (*upIdentities, error) {
	var accounts []string
	for _, e := range services.Table() {
		accounts = append(accounts, e.Name)
	}
	// The simulated nodes' CSI node plugins, which are no service of their own, and the
	// console, which only reads.
	accounts = append(accounts, "csi-node", "console")
	namespaces, err := identity.Apply(ctx, admin, accounts, identity.ApplyOptions{BindIn: map[string]string{
		"webhook-listener": o.scmNamespace,
		"metrics-agent":    o.scmNamespace,
	}})
	if err != nil {
		return nil, err
	}
	if err := identity.GrantKeeper(ctx, admin, identity.KeeperUser, namespaces); err != nil {
		return nil, err
	}
	keeperCfg, err := issue(identity.KeeperUser)
	if err != nil {
		return nil, err
	}
	idDir := filepath.Join(o.dataDir, "identities")
	keeper, err := identity.NewKeeper(keeperCfg, idDir)
	if err != nil {
		return nil, err
	}
	// One token per account, requested once here (the keeper renews it): every service's
	// config, selected or not, so each kubeconfig is on disk for a process of its own.
	configs := map[string]*rest.Config{}
	var configsMu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	for _, name := range accounts {
		g.Go(func() error { // TokenRequests in parallel: each is a round trip and two file writes
			cfg, err := keeper.Config(gctx, namespaces[name], identity.ServiceAccount(name))
			if err != nil {
				return err
			}
			services.Unthrottle(cfg)
			configsMu.Lock()
			configs[name] = cfg
			configsMu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := installStorageClass(ctx, admin); err != nil {
		return nil, err
	}
	if err := installSnapshotClass(ctx, admin); err != nil {
		return nil, err
	}
	return &upIdentities{keeper: keeper, namespaces: namespaces, configs: configs, dir: idDir}, nil
}

// StorageClassName is the StorageClass `crdipc up` installs for the driver.
const StorageClassName = "crdipc"

// installStorageClass installs the StorageClass crdipc: 3 replicas, deleted with the claim,
// bound at once (a volume reaches its replicas from any node: there is no topology for
// kube-scheduler to wait for with WaitForFirstConsumer), claims may grow. It is the cluster's configuration, not a service's: up writes it with its own
// credentials.
func installStorageClass(ctx context.Context, admin *rest.Config) error {
	c, err := client.New(admin, client.Options{})
	if err != nil {
		return fmt.Errorf("csi: %w", err)
	}
	sc := &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: StorageClassName},
		Provisioner:          driver.Name,
		Parameters:           map[string]string{driver.ParamReplicaCount: "3"},
		ReclaimPolicy:        ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode:    ptr.To(storagev1.VolumeBindingImmediate),
		AllowVolumeExpansion: ptr.To(true),
	}
	err = c.Create(ctx, sc)
	if apierrors.IsAlreadyExists(err) {
		// A data dir from before claims could grow: its class says nothing on expansion,
		// which Kubernetes reads as no. One set either way by its user is left alone.
		var have storagev1.StorageClass
		if err = c.Get(ctx, client.ObjectKey{Name: StorageClassName}, &have); err == nil && have.AllowVolumeExpansion == nil {
			base := have.DeepCopy()
			have.AllowVolumeExpansion = ptr.To(true)
			err = c.Patch(ctx, &have, client.MergeFrom(base))
		}
	}
	if err != nil {
		return fmt.Errorf("csi: installing StorageClass %s: %w", StorageClassName, err)
	}
	return nil
}

// SnapshotClassName is the VolumeSnapshotClass `crdipc up` installs for the driver.
const SnapshotClassName = "crdipc"

// installSnapshotClass installs the VolumeSnapshotClass crdipc, the cluster's default (a
// VolumeSnapshot that names no class gets it): snapshots taken by the driver, deleted with
// their VolumeSnapshot. One that exists is left as it is: its user may have changed it.
//
// It is written with a server-side apply, not a create: the API server holds every create
// of a custom resource for 2 s while its CRD is less than 2 s Established (so that, with
// several API servers, none answers 404 for an object another just created), and on a
// fresh data dir this class is the first such object, which made every fresh `up` 2 s
// slower. An apply that creates is not held; one API server has nothing to wait for.
func installSnapshotClass(ctx context.Context, admin *rest.Config) error {
	c, err := snapclientset.NewForConfig(admin)
	if err != nil {
		return fmt.Errorf("csi: %w", err)
	}
	classes := c.SnapshotV1().VolumeSnapshotClasses()
	if _, err := classes.Get(ctx, SnapshotClassName, metav1.GetOptions{}); err == nil {
		return nil
	} else if !apierrors.IsNotFound(err) {
		return fmt.Errorf("csi: reading VolumeSnapshotClass %s: %w", SnapshotClassName, err)
	}
	vsc := &snapv1.VolumeSnapshotClass{
		TypeMeta: metav1.TypeMeta{APIVersion: snapv1.SchemeGroupVersion.String(), Kind: "VolumeSnapshotClass"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        SnapshotClassName,
			Annotations: map[string]string{"snapshot.storage.kubernetes.io/is-default-class": "true"},
		},
		Driver:         driver.Name,
		DeletionPolicy: snapv1.VolumeSnapshotContentDelete,
	}
	body, err := json.Marshal(vsc)
	if err != nil {
		return fmt.Errorf("csi: encoding VolumeSnapshotClass %s: %w", SnapshotClassName, err)
	}
	// Not forced: a class someone else wrote meanwhile conflicts and is theirs.
	_, err = classes.Patch(ctx, SnapshotClassName, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: install.FieldManager})
	if err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("csi: installing VolumeSnapshotClass %s: %w", SnapshotClassName, err)
	}
	return nil
}
