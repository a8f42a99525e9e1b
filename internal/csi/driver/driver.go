package driver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/tracing"
	"github.com/crdipc/crdipc/internal/unixsocket"
)

// The driver's permissions: the storage kinds it needs and nothing else. In particular no
// PersistentVolumeClaims, PersistentVolumes, VolumeAttachments, nor any Secret but the
// storage data CA (target.go): the sidecar holds
// those, so a compromised driver cannot read or rebind other tenants' claims.
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorvolumes,verbs=get;list;watch;create;delete;patch;update
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorpools,verbs=get;list;watch

// Name is the driver's CSI name: the StorageClass provisioner and the VolumeAttachment attacher.
const Name = storagev1alpha1.CSIDriverName

// Annotations the driver keeps on a CStorVolume. They are metadata, not spec, so writing
// them does not bump the generation the operator reconciles.
const (
	// AnnotationName is the CSI volume name the CStorVolume was created for; it tells two
	// names that hash to the same object name apart.
	AnnotationName = "csi.crdipc.io/name"
	// AnnotationPublished records the nodes the volume is ControllerPublished to, as a JSON
	// object node → "rw" | "ro". DeleteVolume refuses while it is not empty.
	AnnotationPublished = storagev1alpha1.AnnotationPublished
	// AnnotationContentSource is the content source the volume was created from, as CSI
	// named it: "snapshot:<snapshot id>" or "volume:<volume id>" (a clone). A retried
	// CreateVolume must ask for the same.
	AnnotationContentSource = "csi.crdipc.io/content-source"
)

// Parameters a StorageClass may set.
const (
	// ParamReplicaCount is the CStorVolume's replicationFactor (1–5, default 3).
	ParamReplicaCount = "replicaCount"
	// ParamConsistencyFactor is the CStorVolume's consistencyFactor (default a majority).
	ParamConsistencyFactor = "consistencyFactor"
	// ParamBackup, "<store>/<backup id>", fills the volume from a backup in a BackupStore
	// (storagev1alpha1.CSIParamBackup): the provisioner's, never a StorageClass's.
	ParamBackup = storagev1alpha1.CSIParamBackup
)

// Options configure a Driver.
type Options struct {
	// Client talks to the API server; when nil one is built from Config.
	Client client.WithWatch
	// Config is used when Client is nil, and to request the Node service's data-path
	// certificate unless DataConfig is set.
	Config *rest.Config
	// DataConfig, when set, returns the config the Node service requests its data-path
	// certificate with: the operator approves only a requester bound to NodeID, such as a
	// ServiceAccount token bound to the node. It is called when the certificate is first
	// needed (a node-bound token needs its Node).
	DataConfig func() (*rest.Config, error)
	// Namespace holds the CStorVolumes the driver creates; default crdipc-system.
	Namespace string
	// NodeID is the node this process serves for the Node service (NodeGetInfo, NodeStage,
	// NodePublish). Empty: the Node service answers FailedPrecondition.
	NodeID string
	// FDHolder is the socket of the fd holder (crdipc fd-holder) that keeps the staged
	// volumes' FUSE connections while no process of this driver serves them: with it, a
	// restart, upgrade or crash of the node plugin pauses the volumes' I/O instead of
	// failing it (takeover.go). Empty: no holder; a volume's I/O fails when this process
	// exits, until its pods are restarted.
	FDHolder string
	// HandoverDir holds the lock that the process serving this node's volumes holds and the
	// socket on which it hands them to a successor that starts before it stops (a
	// DaemonSet's maxSurge; handover.go). Used with FDHolder; empty: a successor waits for
	// its predecessor to exit.
	HandoverDir string
	// LocalReplicaSocket is the socket on which this node's pool agent serves its replicas
	// to this node's targets without TLS (the agent's --local-socket, by default
	// /var/lib/crdipc/local/replica.sock): a target reaches the replica on its own node
	// there, and over TLS when it cannot (empty: always over TLS).
	LocalReplicaSocket string
	// TargetDir holds the FUSE mounts of the volume targets this node runs (one directory
	// per staged volume); default /var/lib/crdipc/csi/targets.
	TargetDir string
	// KubeletRoot is the kubelet's root directory: the Node service stages, publishes,
	// unmounts and removes only paths inside it; default DefaultKubeletRoot.
	KubeletRoot string
	// ExtraRoots are more directories the Node service's paths may lie in, for a node
	// where something besides the kubelet stages and publishes: `crdipc up` adds the
	// system temp directory, where the CSI sanity suite puts its paths by default
	// ($TMPDIR/csi-mount, $TMPDIR/csi-staging).
	ExtraRoots []string
	// NodeRelay is the socket of another instance's Node service, served here as this
	// instance's own (instead of FailedPrecondition) when NodeID is empty: `crdipc up`
	// relays its controller socket's Node calls to node-1's node plugin, so that a tool
	// that speaks to one socket (csi-sanity) meets a whole driver, while the node plugin
	// keeps its own, read-only identity.
	NodeRelay string
	// DefaultCapacity is the size of a volume whose request names none; default 1 GiB.
	DefaultCapacity int64
	// CreateTimeout bounds how long CreateVolume waits for the volume when the caller's
	// context has no deadline; default 60 s.
	CreateTimeout time.Duration
	// Logger; default the controller-runtime global logger.
	Logger *logr.Logger
	// Registerer takes the driver's metrics; default controller-runtime's registry, which
	// `crdipc up` serves on its /metrics.
	Registerer prometheus.Registerer
	// TracerProvider, when set, continues the trace of each CSI call that arrives in one
	// (the sidecar's, in the gRPC metadata) with a server span, and CreateVolume stores
	// it on the CStorVolume it creates, for the operator to continue. Calls outside a
	// trace (probes, csi-sanity, the kubelet) start none.
	TracerProvider trace.TracerProvider
}

// Driver implements the CSI Identity, Controller and Node services.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer

	c       client.WithWatch
	o       Options
	log     logr.Logger
	metrics *metrics

	// publishMu serialises ControllerPublish/Unpublish of one process; across processes the
	// annotation patch's optimistic lock does.
	publishMu sync.Mutex

	// nodeOps holds the volumes with a Node call in flight (see lockVolume).
	nodeOps struct {
		sync.Mutex
		busy map[string]bool
	}
	hostOnce sync.Once
	host     *host // see node()

	// taking joins the callers that take the same snapshot at once (CreateSnapshot and
	// the node's own watch of its snapshots) into one take.
	taking singleflight.Group

	// data is the Node service's data path: its TLS identity and the volumes it stages.
	data struct {
		sync.Mutex
		tls    *tls.Config
		ready  chan struct{}   // closed once tls is set; nil until dataTLS is first called
		life   context.Context // ServeListener's: the data identity is kept while it serves
		staged map[string]*staged
	}

	// preparing: a predecessor serves the node's volumes, and this process gets ready to
	// take them over (not ready until it can). handedOver: this process gave them to a
	// successor and serves no more.
	preparing, handedOver atomic.Bool

	// serving is closed once the driver serves CSI (Serving).
	servingOnce sync.Once
	serving     chan struct{}

	// probe keeps one Probe result for a second: the sidecar and liveness probes may call
	// Probe often, and each answer costs an API round trip.
	probe struct {
		sync.Mutex
		at    time.Time
		ready bool
	}
}

// New returns a Driver; it does not contact the API server.
func New(o Options) (*Driver, error) {
	if o.Namespace == "" {
		o.Namespace = install.SystemNamespace
	}
	if o.DefaultCapacity == 0 {
		o.DefaultCapacity = 1 << 30
	}
	if o.CreateTimeout == 0 {
		o.CreateTimeout = 60 * time.Second
	}
	if o.TargetDir == "" {
		o.TargetDir = "/var/lib/crdipc/csi/targets"
	}
	if abs, err := filepath.Abs(o.TargetDir); err == nil {
		o.TargetDir = abs
	}
	if o.KubeletRoot == "" {
		o.KubeletRoot = DefaultKubeletRoot
	}
	if abs, err := filepath.Abs(o.KubeletRoot); err == nil {
		o.KubeletRoot = abs
	}
	o.ExtraRoots = slices.Clone(o.ExtraRoots)
	for i, r := range o.ExtraRoots {
		if !filepath.IsAbs(r) {
			return nil, fmt.Errorf("csi driver: extra root %q is not an absolute path", r)
		}
		o.ExtraRoots[i] = filepath.Clean(r)
	}
	c := o.Client
	if c == nil {
		if o.Config == nil {
			return nil, errors.New("csi driver: a client or a rest config is required")
		}
		var err error
		if c, err = client.NewWithWatch(o.Config, client.Options{Scheme: scheme.Scheme}); err != nil {
			return nil, fmt.Errorf("csi driver: %w", err)
		}
	}
	l := log.Log.WithName("csi-driver")
	if o.Logger != nil {
		l = *o.Logger
	}
	if o.Registerer == nil {
		o.Registerer = ctrlmetrics.Registry
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, err
	}
	return &Driver{c: c, o: o, log: l, metrics: m}, nil
}

// Serve serves the three CSI services on endpoint (unix:///path or a plain path) until ctx
// ends, then stops gracefully. A stale socket file from an earlier run is removed first.
//
// A node plugin that may hand over (Options.HandoverDir) binds the socket only once it
// holds the node's serving lock: a successor started while another process serves the
// node (a DaemonSet's surge pod) leaves that process's socket, where the kubelet's Node
// calls go, alone until the node's volumes are its own; a successor that never gets that
// far (it crash-loops, or waits for its certificate) takes nothing away.
func (d *Driver) Serve(ctx context.Context, endpoint string) error {
	path, err := SocketPath(endpoint)
	if err != nil {
		return err
	}
	return d.serve(ctx, nil, path)
}

// ServeListener is Serve on a listener the caller opened: bound before the serving lock is
// held, so only for a socket no other process of the driver serves.
func (d *Driver) ServeListener(ctx context.Context, l net.Listener) error {
	return d.serve(ctx, l, "")
}

// Serving is closed once the driver serves CSI on its socket: for a node plugin, once it
// holds the node's volumes. A registration with the kubelet waits for it.
func (d *Driver) Serving() <-chan struct{} {
	d.servingOnce.Do(func() { d.serving = make(chan struct{}) })
	return d.serving
}

// serve serves on l, or, when l is nil, on the socket at path, bound once this process
// may serve the node's volumes.
func (d *Driver) serve(ctx context.Context, l net.Listener, path string) (err error) {
	served := false
	defer func() {
		if l != nil && !served {
			l.Close()
		}
	}()
	d.data.Lock()
	if d.data.life == nil {
		d.data.life = ctx
	}
	d.data.Unlock()
	opts := []grpc.ServerOption{grpc.UnaryInterceptor(d.intercept)}
	if d.o.TracerProvider != nil {
		opts = append(opts, grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(tracing.ChildOnly(d.o.TracerProvider)),
			otelgrpc.WithPropagators(propagation.TraceContext{}))))
	}
	srv := grpc.NewServer(opts...)
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterControllerServer(srv, d)
	if d.o.NodeID == "" && d.o.NodeRelay != "" {
		r, err := newNodeRelay(d.o.NodeRelay)
		if err != nil {
			return err
		}
		defer r.close()
		csi.RegisterNodeServer(srv, r)
	} else {
		csi.RegisterNodeServer(srv, d)
	}
	// Before any Node call is served: the node's volumes are this process's alone (a
	// predecessor still running hands them over), and those an earlier process left are
	// locked until they are served again.
	var turn *os.File
	var ho *handover
	if d.holder() != nil {
		if turn, err = d.takeTurn(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		defer turn.Close()
		if ho, err = d.listenHandover(); err != nil {
			return err
		}
		defer ho.close()
	}
	if l == nil {
		if l, err = Listen(path); err != nil {
			return err
		}
	}
	// sctx ends what serves the volumes (their takeover, the holder's upkeep, snapshots)
	// before they are released, however serving ends.
	sctx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	d.recoverTargets(sctx)
	kept := make(chan struct{})
	go func() { defer close(kept); d.keepLoop(sctx) }()
	errc := make(chan error, 1)
	served = true
	go func() { errc <- srv.Serve(l) }()
	select {
	case <-d.Serving():
	default:
		close(d.serving)
	}
	if d.o.NodeID != "" {
		// Snapshots of volumes published to this node are taken here, where their target
		// runs; CreateSnapshot on the controller waits for them.
		go d.serveSnapshots(sctx)
	}
	handingOver := false
	var serveErr error
	select {
	case err := <-errc:
		// The process is to stop: the volumes go to the next one as on SIGTERM, and the
		// serving lock only once they are released.
		serveErr = fmt.Errorf("csi driver: serving: %w", err)
		d.log.Error(err, "serving CSI failed; releasing this node's volumes for the next process")
	case <-ctx.Done():
	case <-ho.asked():
		handingOver = true
	}
	ho.leave()
	stopServing()
	// In-flight calls get a moment to finish; a CreateVolume awaiting a volume would hold
	// shutdown for its whole deadline, and the sidecar retries it anyway.
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		srv.Stop()
	}
	d.awaitNodeOps(30 * time.Second)
	<-kept
	d.releaseTargets()
	if turn != nil {
		turn.Close()
	}
	ho.done()
	if handingOver {
		d.handedOver.Store(true)
		d.log.Info("this node's volumes are handed over to the successor; serving nothing until stopped")
		<-ctx.Done()
	}
	return serveErr
}

// Listen opens the Unix socket of endpoint, removing a stale socket file first. Closing it
// removes the file only while it is still this listener's: a successor that started before
// this process stopped has bound its own there.
func Listen(endpoint string) (net.Listener, error) {
	path, err := SocketPath(endpoint)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("csi driver: %w", err)
	}
	l, err := unixsocket.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("csi driver: %w", err)
	}
	return l, nil
}

// SocketPath returns the absolute file of a unix:// endpoint (or of a plain path). A
// relative path ("unix://.crdipc/csi.sock", as a relative --data-dir makes) is resolved
// against the working directory now: gRPC would read its first element as a host.
func SocketPath(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	var path string
	switch u.Scheme {
	case "unix":
		path = u.Host + u.Path
	case "":
		path = endpoint
	default:
		return "", fmt.Errorf("endpoint %q: only unix:// sockets are supported", endpoint)
	}
	if path == "" {
		return "", fmt.Errorf("endpoint %q names no socket file", endpoint)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	return abs, nil
}

// Endpoint returns the canonical form of a socket endpoint, unix:///absolute/path, the
// only form every gRPC client and every reader of a log line understands alike.
func Endpoint(endpoint string) (string, error) {
	path, err := SocketPath(endpoint)
	if err != nil {
		return "", err
	}
	return "unix://" + path, nil
}

func (d *Driver) volumeKey(id string) client.ObjectKey {
	return client.ObjectKey{Namespace: d.o.Namespace, Name: id}
}

// newVolume is an empty CStorVolume the client can decode into.
func newVolume() *storagev1alpha1.CStorVolume { return &storagev1alpha1.CStorVolume{} }
