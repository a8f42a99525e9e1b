package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/storage/backend"
	"github.com/crdipc/crdipc/ipc"
)

// A pool agent's permissions: read the pools and replicas (the API server lets it list
// only what it asks for, its node's, but RBAC cannot restrict it to them), write their
// finalizers and status — never create or delete them — Events, and its node Lease.
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorpools;cstorvolumereplicas,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorpools/status;cstorvolumereplicas/status,verbs=get;update;patch
// It reads snapshots to fill restored replicas, and lists them to find the copies of
// snapshots that are gone (reconcile_snapshots.go).
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorvolumesnapshots,verbs=get;list
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=crdipc-system

// Options configure an agent.
type Options struct {
	// Node is the node this agent serves. Required.
	Node string
	// Root is the directory of the file backend (and of zfs vdev files). Required.
	Root string
	// Resync is how often every pool and replica is compared with the disk. Default 10 s.
	Resync time.Duration
	// Identity names this agent in the node Lease; default hostname_uuid. Two agents with
	// the same identity count as one, so give each process its own.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod tune the node Lease; defaults 15 s,
	// 10 s, 2 s. A standby agent takes over at most LeaseDuration after the holder died
	// without releasing it.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// MetricsAddr and HealthAddr serve /metrics and /healthz, /readyz; empty or "0": off.
	MetricsAddr, HealthAddr string
	// Backends overrides the backends by name. Default: file under Root; zfs when the
	// zpool and zfs commands exist.
	Backends map[storagev1alpha1.Backend]backend.Backend
	// DataAddr is where the node's replica data service listens (host:port); empty: no data
	// service, the replicas are files nobody else can reach. A host-less address (":9500")
	// needs DataAdvertiseHost, the address peers dial.
	DataAddr, DataAdvertiseHost string
	// LocalSocket is where the data service also serves the CSI node plugin of this node,
	// over a Unix socket without TLS (replica.ServerOptions.LocalSocket): the target's link
	// to the replica on its own node. Default LocalSocket(Root); "none": not served (the
	// target reaches it over TLS, as it does when the socket cannot be used).
	LocalSocket string
	// CatchUpTimeout bounds how long the agent's readiness (/readyz) waits, from taking the
	// node Lease, for the node's replicas that targets write to be caught up; default 10m.
	CatchUpTimeout time.Duration
	// MaxConcurrentReconciles per kind; default 4.
	MaxConcurrentReconciles int
	// Logger for the agent; default: controller-runtime's global logger.
	Logger *logr.Logger
	// TracerProvider traces the pools' and replicas' reconciles, each continuing the trace
	// of the request that created the object (ipc.Options.TracerProvider); default the
	// global provider.
	TracerProvider trace.TracerProvider
}

// Agent serves one node. Run it with Run.
type Agent struct {
	cfg     *rest.Config
	o       Options
	leading atomic.Bool
	// ready is the readiness of the manager running now (each start makes a new one).
	ready atomic.Pointer[catchUp]
}

// New checks o and returns an agent for o.Node.
func New(cfg *rest.Config, o Options) (*Agent, error) {
	if o.Node == "" {
		return nil, errors.New("agent: a node name is required")
	}
	if o.Root == "" {
		return nil, errors.New("agent: a root directory is required")
	}
	if o.Resync <= 0 {
		o.Resync = 10 * time.Second
	}
	if o.Identity == "" {
		host, _ := os.Hostname()
		o.Identity = host + "_" + string(uuid.NewUUID())
	}
	if o.LeaseDuration <= 0 {
		o.LeaseDuration = 15 * time.Second
	}
	if o.RenewDeadline <= 0 {
		o.RenewDeadline = 10 * time.Second
	}
	if o.RetryPeriod <= 0 {
		o.RetryPeriod = 2 * time.Second
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = "0"
	}
	if o.HealthAddr == "" {
		o.HealthAddr = "0"
	}
	if o.MaxConcurrentReconciles <= 0 {
		o.MaxConcurrentReconciles = 4
	}
	if o.CatchUpTimeout <= 0 {
		o.CatchUpTimeout = 10 * time.Minute
	}
	if o.Backends == nil {
		o.Backends = map[storagev1alpha1.Backend]backend.Backend{
			storagev1alpha1.BackendFile: backend.NewFile(o.Root),
		}
		if backend.ZFSAvailable() {
			o.Backends[storagev1alpha1.BackendZFS] = backend.NewZFS(filepath.Join(o.Root, "zfs"))
		}
	}
	return &Agent{cfg: cfg, o: o}, nil
}

// Leading reports whether this agent holds its node's Lease and acts.
func (a *Agent) Leading() bool { return a.leading.Load() }

// Ready is the agent's readiness, as /readyz serves it: nil once the agent holds the node
// Lease and the replicas that targets write on its node are caught up (or CatchUpTimeout
// has passed since it took the Lease); otherwise an error saying what it waits for.
func (a *Agent) Ready(req *http.Request) error {
	c := a.ready.Load()
	if c == nil {
		return errors.New("not started")
	}
	return c.check(req)
}

// Run serves the node until ctx ends. Losing the node Lease stops the agent's controllers
// at once (another agent may act now); Run then starts over and waits for the Lease again,
// as a restarted pod would.
func (a *Agent) Run(ctx context.Context) error {
	log := ctrl.Log.WithName("pool-agent").WithValues("node", a.o.Node)
	if a.o.Logger != nil {
		log = a.o.Logger.WithValues("node", a.o.Node)
	}
	retry := time.Second
	for {
		mgr, data, err := a.newManager(log)
		if err != nil {
			return err
		}
		go func() {
			select {
			case <-mgr.Elected():
				a.ready.Load().leading(time.Now())
				a.leading.Store(true)
				log.Info("holding the node lease; serving the node")
			case <-ctx.Done():
			}
		}()
		err = mgr.Start(ctx)
		if data != nil {
			data.ln.Close() // bound even if the Lease never came; the next manager binds anew
		}
		a.leading.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		log.Error(err, "pool agent stopped; starting again", "after", retry)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retry):
		}
	}
}

func (a *Agent) newManager(log logr.Logger) (manager.Manager, *dataServer, error) {
	lock, err := resourcelock.NewFromKubeconfig(resourcelock.LeasesResourceLock, install.SystemNamespace, storagev1alpha1.NodeLeaseName(a.o.Node),
		resourcelock.ResourceLockConfig{Identity: a.o.Identity}, a.cfg, a.o.RenewDeadline)
	if err != nil {
		return nil, nil, fmt.Errorf("creating node lease lock: %w", err)
	}
	own := cache.ByObject{Field: fields.OneTermEqualSelector(storagev1alpha1.FieldNodeName, a.o.Node)}
	mgr, err := ctrl.NewManager(a.cfg, ctrl.Options{
		Scheme:                 scheme.Scheme,
		Logger:                 log,
		Metrics:                metricsserver.Options{BindAddress: a.o.MetricsAddr},
		HealthProbeBindAddress: a.o.HealthAddr,
		// The node Lease is the fence: only its holder runs the controllers below.
		LeaderElection:                      true,
		LeaderElectionResourceLockInterface: lock,
		LeaderElectionReleaseOnCancel:       true,
		LeaseDuration:                       ptr.To(a.o.LeaseDuration),
		RenewDeadline:                       ptr.To(a.o.RenewDeadline),
		RetryPeriod:                         ptr.To(a.o.RetryPeriod),
		// The API server filters by the selectable field spec.nodeName: the agent never
		// sees, nor caches, other nodes' objects.
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&storagev1alpha1.CStorPool{}:          own,
			&storagev1alpha1.CStorVolumeReplica{}: own,
			// Only the backups the operator gave this node to upload.
			&storagev1alpha1.VolumeBackup{}: {Label: labels.SelectorFromSet(labels.Set{storagev1alpha1.LabelBackupNode: a.o.Node})},
		}},
		// Agents for several nodes share one process in `crdipc up`, and an agent
		// restarts its manager after losing the Lease.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("creating manager: %w", err)
	}
	if a.o.HealthAddr != "0" {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return nil, nil, err
		}
	}
	var data *dataServer
	if a.o.DataAddr != "" {
		kube, err := kubernetes.NewForConfig(a.cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("replica data service: %w", err)
		}
		data, err = newDataServer(a.o.Node, a.o.DataAddr, a.o.DataAdvertiseHost, a.localSocket(), install.SystemNamespace, mgr.GetClient(), mgr.GetAPIReader(), kube, a.backend, log)
		if err != nil {
			return nil, nil, err
		}
		if err := mgr.Add(data); err != nil {
			data.ln.Close()
			return nil, nil, err
		}
	}
	ready := &catchUp{node: a.o.Node, cache: mgr.GetCache(), data: data, timeout: a.o.CatchUpTimeout, log: log.WithName("readiness")}
	a.ready.Store(ready)
	if a.o.HealthAddr != "0" {
		if err := mgr.AddReadyzCheck("replicas", ready.check); err != nil {
			if data != nil {
				data.ln.Close()
			}
			return nil, nil, err
		}
	}
	if err := a.register(mgr, data, ready); err != nil {
		if data != nil {
			data.ln.Close()
		}
		return nil, nil, err
	}
	return mgr, data, nil
}

// backend returns the backend for a pool of the named kind.
// LocalSocket is where the agent with root serves the node's CSI plugin by default
// (Options.LocalSocket): in a directory of its own under root, which the plugin mounts.
func LocalSocket(root string) string { return filepath.Join(root, "local", "replica.sock") }

// localSocket is Options.LocalSocket with its default: empty for "none".
func (a *Agent) localSocket() string {
	switch a.o.LocalSocket {
	case "":
		return LocalSocket(a.o.Root)
	case "none":
		return ""
	}
	return a.o.LocalSocket
}

func (a *Agent) backend(name storagev1alpha1.Backend) (backend.Backend, error) {
	if name == "" {
		name = storagev1alpha1.BackendFile
	}
	b, ok := a.o.Backends[name]
	if !ok {
		return nil, fmt.Errorf("backend %q is not available on node %s", name, a.o.Node)
	}
	return b, nil
}

// register adds the two receivers, CStorPool and CStorVolumeReplica, and the backup
// uploader to mgr.
func (a *Agent) register(mgr manager.Manager, data *dataServer, ready *catchUp) error {
	ctx := context.Background()
	if err := mgr.GetFieldIndexer().IndexField(ctx, &storagev1alpha1.CStorVolumeReplica{}, storagev1alpha1.FieldPool, func(o client.Object) []string {
		return []string{o.(*storagev1alpha1.CStorVolumeReplica).Spec.Pool}
	}); err != nil {
		return fmt.Errorf("indexing replicas by pool: %w", err)
	}
	backends := a.backend
	base := ipc.Options{
		Finalizer:               storagev1alpha1.AgentFinalizer,
		MaxConcurrentReconciles: a.o.MaxConcurrentReconciles,
		// A conflict on a status write is retried through the rate limiter: start fast.
		BackoffBase: 5 * time.Millisecond,
		BackoffMax:  30 * time.Second,
		// The node Lease already says whether this node's agent is alive; one heartbeat
		// Lease per kind shared by every node's agent would say nothing more.
		LeaseDuration:  -1,
		TracerProvider: a.o.TracerProvider,
	}
	pools := &poolHandler{node: a.o.Node, c: mgr.GetClient(), live: mgr.GetAPIReader(), backends: backends, resync: a.o.Resync}
	po := base
	po.Name = "cstorpool-agent"
	po.Watches = []ipc.Watch{{
		// A pool held by replicas is deleted once the last of them is gone.
		Object:     &storagev1alpha1.CStorVolumeReplica{},
		Map:        replicaToPool,
		Predicates: []predicate.Predicate{replicaGone},
	}}
	if err := ipc.Register(mgr, &storagev1alpha1.CStorPool{}, ipc.Handler[*storagev1alpha1.CStorPool](pools), po); err != nil {
		return err
	}
	uploads := &backupUploader{node: a.o.Node, c: mgr.GetClient(), live: mgr.GetAPIReader(), log: mgr.GetLogger().WithName("backup")}
	if err := uploads.setup(mgr, 2); err != nil {
		return fmt.Errorf("backup uploader: %w", err)
	}
	replicas := &replicaHandler{node: a.o.Node, c: mgr.GetClient(), live: mgr.GetAPIReader(), backends: backends, resync: a.o.Resync, data: data, ready: ready}
	ro := base
	ro.Name = "cstorvolumereplica-agent"
	ro.Watches = []ipc.Watch{{
		// Replicas waiting in Init are created as soon as their pool is.
		Object:     &storagev1alpha1.CStorPool{},
		Map:        replicas.poolToReplicas,
		Predicates: []predicate.Predicate{poolPhaseChanged},
	}}
	return ipc.Register(mgr, &storagev1alpha1.CStorVolumeReplica{}, ipc.Handler[*storagev1alpha1.CStorVolumeReplica](replicas), ro)
}
