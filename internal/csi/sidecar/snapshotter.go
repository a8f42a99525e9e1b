package sidecar

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	snapclientset "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	snapscheme "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned/scheme"
	snapinformers "github.com/kubernetes-csi/external-snapshotter/client/v8/informers/externalversions"
	sidecarctrl "github.com/kubernetes-csi/external-snapshotter/v8/pkg/sidecar-controller"
	"github.com/kubernetes-csi/external-snapshotter/v8/pkg/snapshotter"
	"google.golang.org/grpc"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
)

// The snapshotter's part of upstream's csi-snapshotter role (group snapshots are off).
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshotclasses,verbs=get;list;watch
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshotcontents,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshotcontents/status,verbs=update;patch

// snapshotNamePrefix is upstream's csi-snapshotter's default: the snapshot of
// VolumeSnapshot X is named "snapshot-<X's UID>" in CreateSnapshot, so a retry asks for the
// same one.
const snapshotNamePrefix = "snapshot"

// snapshotWorkers is how many contents the snapshotter works on at once (upstream: 10).
const snapshotWorkers = 10

func init() {
	// Upstream's Event recorder refers to VolumeSnapshotContents through client-go's scheme,
	// as its binary does after adding them. Added once, at start: the scheme is shared and
	// read by every recorder of the process.
	if err := snapscheme.AddToScheme(clientgoscheme.Scheme); err != nil {
		panic(fmt.Sprintf("csi sidecar: adding the snapshot kinds to client-go's scheme: %v", err))
	}
}

// offersSnapshots asks the driver, waiting (with backoff, until ctx ends) for it to answer,
// whether it offers CREATE_DELETE_SNAPSHOT.
func offersSnapshots(ctx context.Context, cc csi.ControllerClient, endpoint string, l logr.Logger) (bool, error) {
	delay := 50 * time.Millisecond
	var lastLog time.Time
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		caps, err := cc.ControllerGetCapabilities(cctx, &csi.ControllerGetCapabilitiesRequest{})
		cancel()
		if err == nil {
			for _, c := range caps.GetCapabilities() {
				if c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT {
					return true, nil
				}
			}
			return false, nil
		}
		if !Retryable(err) {
			return false, fmt.Errorf("csi sidecar: ControllerGetCapabilities: %w", err)
		}
		if time.Since(lastLog) >= unreachableLogEvery && ctx.Err() == nil {
			l.Error(err, "the CSI driver cannot be reached; no VolumeSnapshotContent is served until it answers", "endpoint", endpoint)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// runSnapshotter runs upstream's csi-snapshotter controller (external-snapshotter's
// sidecar-controller, as its own binary runs it) for driver name until ctx ends: a
// VolumeSnapshotContent of the driver becomes CreateSnapshot, its deletion DeleteSnapshot,
// and the outcome its status. A driver that does not offer CREATE_DELETE_SNAPSHOT gets none
// (upstream's binary refuses to start for one): its contents are left alone.
func runSnapshotter(ctx context.Context, cfg *rest.Config, conn *grpc.ClientConn, name string, o Options, l logr.Logger) error {
	offers, err := offersSnapshots(ctx, csi.NewControllerClient(conn), o.DriverEndpoint, l)
	if err != nil || !offers {
		if err == nil {
			l.Info("the CSI driver does not offer CREATE_DELETE_SNAPSHOT; VolumeSnapshots of its volumes are not taken", "driver", name)
		}
		return err
	}
	snaps, err := snapclientset.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("csi sidecar: %w", err)
	}
	// Core kinds (Events) as protobuf, as upstream's binary asks for them.
	core := rest.CopyConfig(cfg)
	core.ContentType = runtime.ContentTypeProtobuf
	kube, err := kubernetes.NewForConfig(core)
	if err != nil {
		return fmt.Errorf("csi sidecar: %w", err)
	}
	sf := snapinformers.NewSharedInformerFactory(snaps, o.Resync)
	backoff := func() workqueue.TypedRateLimiter[string] {
		return workqueue.NewTypedItemExponentialFailureRateLimiter[string](o.BackoffBase, o.BackoffMax)
	}
	ctrl := sidecarctrl.NewCSISnapshotSideCarController(
		snaps, kube, name,
		sf.Snapshot().V1().VolumeSnapshotContents(),
		sf.Snapshot().V1().VolumeSnapshotClasses(),
		snapshotter.NewSnapshotter(conn),
		nil, // group snapshots: off
		o.SnapshotTimeout, o.Resync,
		snapshotNamePrefix, -1, // upstream's defaults: the whole UID
		"", -1,
		false, // no extra create metadata: the driver takes no snapshot parameters
		backoff(),
		false, nil, nil, backoff(),
	)
	l.Info("serving VolumeSnapshotContents", "driver", name)
	sf.Start(ctx.Done())
	var wg sync.WaitGroup
	ctrl.Run(snapshotWorkers, ctx.Done(), &wg)
	wg.Wait()
	sf.Shutdown()
	return nil
}
