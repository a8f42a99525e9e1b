package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/lru"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/tracing"
)

// The sidecar's permissions: exactly what provisioning and attaching need, and no access to
// the storage.crdipc.io kinds (the driver's business). Claims are patched for the resizer's
// status and for clone source protection (the finalizer and list on a clone's source).
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;list;watch;create;delete;update;patch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims/status,verbs=update;patch
// +kubebuilder:rbac:groups="";events.k8s.io,resources=events,verbs=create;patch;update
// +kubebuilder:rbac:groups=storage.k8s.io,resources=storageclasses,verbs=get;list;watch
// +kubebuilder:rbac:groups=storage.k8s.io,resources=volumeattachments,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=storage.k8s.io,resources=volumeattachments/status,verbs=update;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=crdipc-system,resources=leases,verbs=get;list;watch;create;update;patch;delete

// Options configure the sidecar.
type Options struct {
	// DriverEndpoint is the driver's socket, unix:///path; a relative path is resolved
	// against the working directory when Add is called.
	DriverEndpoint string
	// DriverName is the name the driver is expected to report (the provisioner of its
	// StorageClasses). With it the sidecar serves claims from the start, so a driver that
	// cannot be reached shows as Events on the claims it should serve, not as silence; a
	// driver that answers with another name is a configuration error, reported by
	// readiness. Empty: learn the name from the driver, waiting until it answers.
	DriverName string
	// CallTimeout bounds one CreateVolume/DeleteVolume/ControllerPublish call; default 10 s
	// (as upstream's sidecars). A volume not ready within it comes back Aborted and is
	// retried.
	CallTimeout time.Duration
	// SnapshotTimeout bounds one CreateSnapshot/DeleteSnapshot call; default 1 min (as
	// upstream's csi-snapshotter): a volume staged nowhere is snapshotted by a target the
	// driver starts for the copy, within the call. One that times out is retried.
	SnapshotTimeout time.Duration
	// BackoffBase and BackoffMax shape the retry backoff: BackoffBase doubling per failure up
	// to BackoffMax; defaults 1 s and 5 min.
	BackoffBase, BackoffMax time.Duration
	// Resync re-examines every PVC and PV this often; default 15 min.
	Resync time.Duration
	// Logger; default the controller-runtime global logger.
	Logger *logr.Logger
	// TracerProvider traces each provisioning of a claim (continuing the claim's trace
	// when it carries one, ipc.TraceParentAnnotation) and carries it to the driver in the
	// CSI call's metadata. Default: the global provider.
	TracerProvider trace.TracerProvider
}

func (o *Options) defaults() {
	if o.CallTimeout == 0 {
		o.CallTimeout = 10 * time.Second
	}
	if o.SnapshotTimeout == 0 {
		o.SnapshotTimeout = time.Minute
	}
	if o.BackoffBase == 0 {
		o.BackoffBase = time.Second
	}
	if o.BackoffMax == 0 {
		o.BackoffMax = 5 * time.Minute
	}
	if o.Resync == 0 {
		o.Resync = 15 * time.Minute
	}
}

// Retryable reports whether a gRPC error may succeed when the same call is repeated: the
// driver is busy or unreachable, or the operation is still in progress.
func Retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Canceled, codes.ResourceExhausted:
		return true
	}
	return false
}

// Dial connects to the driver's Unix socket. The connection is lazy: a driver that is not
// up yet (or restarting) shows as Unavailable on the first calls, which are retried.
func Dial(endpoint string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	path, err := driver.SocketPath(endpoint)
	if err != nil {
		return nil, err
	}
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	conn, err := grpc.NewClient("unix://"+path, opts...)
	if err != nil {
		return nil, fmt.Errorf("csi sidecar: dialing %s: %w", endpoint, err)
	}
	return conn, nil
}

// unreachableLogEvery spaces the error lines of a sidecar waiting for its driver: one
// when the wait starts, then one this often, so the log says why nothing happens without
// filling up.
const unreachableLogEvery = 30 * time.Second

// DriverName asks the driver for its name, waiting (with backoff, until ctx ends) for it to
// answer: the sidecar serves exactly the StorageClasses and VolumeAttachments naming it.
// While the driver cannot be reached it logs so at error level, naming endpoint.
func DriverName(ctx context.Context, conn *grpc.ClientConn, endpoint string, l logr.Logger) (string, error) {
	id := csi.NewIdentityClient(conn)
	delay := 50 * time.Millisecond
	var lastLog time.Time
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		info, err := id.GetPluginInfo(cctx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil {
			if info.GetName() == "" {
				return "", errors.New("csi sidecar: the driver reports an empty name")
			}
			return info.GetName(), nil
		}
		if !Retryable(err) {
			return "", fmt.Errorf("csi sidecar: GetPluginInfo: %w", err)
		}
		if time.Since(lastLog) >= unreachableLogEvery && ctx.Err() == nil {
			l.Error(err, "the CSI driver cannot be reached; no claim is served until it answers", "endpoint", endpoint)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("csi sidecar: waiting for the driver at %s: %w (last error: %v)", endpoint, ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// driverCheck is the sidecar's readiness: ready while the driver at endpoint answers its
// CSI Probe and, once known, reports the expected name.
type driverCheck struct {
	endpoint string
	id       csi.IdentityClient
	want     string // expected name; empty: any
}

// check implements healthz.Checker; its error is what /readyz?verbose shows a user.
func (c *driverCheck) check(r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	probe, err := c.id.Probe(ctx, &csi.ProbeRequest{})
	if err != nil {
		return fmt.Errorf("the CSI driver at %s is unreachable: %w", c.endpoint, err)
	}
	// An unset Ready means ready, as the CSI spec says.
	if r := probe.GetReady(); r != nil && !r.GetValue() {
		return fmt.Errorf("the CSI driver at %s answers but is not ready (its Probe)", c.endpoint)
	}
	if c.want == "" {
		return nil
	}
	info, err := c.id.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		return fmt.Errorf("the CSI driver at %s: GetPluginInfo: %w", c.endpoint, err)
	}
	if info.GetName() != c.want {
		return fmt.Errorf("the CSI driver at %s is %q, but this sidecar serves %q", c.endpoint, info.GetName(), c.want)
	}
	return nil
}

// Add adds the provisioner (with its clone source protection), the attacher, the resizer
// and, for a driver that offers CREATE_DELETE_SNAPSHOT, the snapshotter for the driver at
// o.DriverEndpoint to mgr, and a readiness check ("csi-driver") that fails, with the
// reason, while the driver cannot be reached. They run only while mgr leads, so two
// sidecars never act on one object. Without o.DriverName, the driver's name is read from
// the driver when mgr starts.
func Add(mgr manager.Manager, o Options) error {
	o.defaults()
	if o.DriverEndpoint == "" {
		return errors.New("csi sidecar: a driver endpoint is required")
	}
	endpoint, err := driver.Endpoint(o.DriverEndpoint)
	if err != nil {
		return fmt.Errorf("csi sidecar: %w", err)
	}
	o.DriverEndpoint = endpoint
	var dialOpts []grpc.DialOption
	if o.TracerProvider != nil {
		// A call made while provisioning continues the claim's trace in a client span; the
		// others (probes, the driver's name) carry none.
		dialOpts = append(dialOpts, grpc.WithStatsHandler(otelgrpc.NewClientHandler(
			otelgrpc.WithTracerProvider(tracing.ChildOnly(o.TracerProvider)),
			otelgrpc.WithPropagators(propagation.TraceContext{}))))
	}
	conn, err := Dial(endpoint, dialOpts...)
	if err != nil {
		return err
	}
	l := log.Log.WithName("csi-sidecar")
	if o.Logger != nil {
		l = *o.Logger
	}
	kube, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("csi sidecar: %w", err)
	}
	dc := &driverCheck{endpoint: endpoint, id: csi.NewIdentityClient(conn), want: o.DriverName}
	if err := mgr.AddReadyzCheck("csi-driver", dc.check); err != nil {
		return fmt.Errorf("csi sidecar: %w", err)
	}
	st := &started{}
	a := &attacher{started: st, c: mgr.GetClient(), csi: csi.NewControllerClient(conn), o: o, log: l.WithName("attacher")}
	if err := a.setup(mgr); err != nil {
		return err
	}
	cp := &cloneProtection{c: mgr.GetClient(), live: mgr.GetAPIReader(), csi: csi.NewControllerClient(conn), o: o, log: l.WithName("clone-protection")}
	if err := cp.setup(mgr); err != nil {
		return err
	}
	z := &resizer{started: st, c: mgr.GetClient(), fresh: mgr.GetAPIReader(), csi: csi.NewControllerClient(conn), o: o, log: l.WithName("resizer"), failed: lru.New(failedClaimsRemembered)}
	if err := z.setup(mgr); err != nil {
		return err
	}
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		defer conn.Close()
		name := o.DriverName
		if name == "" {
			learned, err := DriverName(ctx, conn, endpoint, l)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			name = learned
		}
		rec := newRecorder(ctx, kube, name)
		st.set(name, rec)
		p, err := newProvisioner(ctx, mgr.GetConfig(), kube, mgr.GetClient(), name, csi.NewControllerClient(conn), cp, o, rec, l.WithName("provisioner"))
		if err != nil {
			return err
		}
		// The snapshotter asks the driver what it offers, which may wait for the driver:
		// beside the provisioner, not before it.
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			sl := l.WithName("snapshotter")
			if err := runSnapshotter(ctx, mgr.GetConfig(), conn, name, o, sl); err != nil && ctx.Err() == nil {
				// Claims and attachments are still served; snapshots wait for a restart.
				sl.Error(err, "VolumeSnapshotContents are not served")
			}
		}()
		p.Run(ctx)
		wg.Wait()
		return nil
	}))
}

// newRecorder records Events as the sidecar of driver name.
func newRecorder(ctx context.Context, kube kubernetes.Interface, name string) record.EventRecorder {
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	go func() { <-ctx.Done(); b.Shutdown() }()
	return b.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "csi-sidecar/" + name})
}

// isGRPC reports whether err carries a gRPC status (a driver answer or a transport failure)
// rather than a Kubernetes-side error, which is always worth retrying.
func isGRPC(err error) bool {
	_, ok := status.FromError(err)
	if ok {
		return true
	}
	var s interface{ GRPCStatus() *status.Status }
	return errors.As(err, &s)
}
