package snapshotcontroller

import (
	"context"
	"fmt"
	"sync"
	"time"

	snapclientset "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	snapscheme "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned/scheme"
	snapinformers "github.com/kubernetes-csi/external-snapshotter/client/v8/informers/externalversions"
	common "github.com/kubernetes-csi/external-snapshotter/v8/pkg/common-controller"
	"github.com/kubernetes-csi/external-snapshotter/v8/pkg/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// What upstream's deploy/kubernetes/snapshot-controller role grants, less the group snapshot
// kinds (not served: VolumeGroupSnapshot is off) and nodes (distributed snapshotting is off).
// +kubebuilder:rbac:groups="",resources=persistentvolumes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;update
// +kubebuilder:rbac:groups="",resources=events,verbs=list;watch;create;update;patch
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshotclasses,verbs=get;list;watch
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshotcontents,verbs=create;get;list;watch;update;delete;patch
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshotcontents/status,verbs=patch
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshots,verbs=create;get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshots/status,verbs=update;patch
// Leader election, outside up.
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=crdipc-system,resources=leases,verbs=get;list;watch;create;update;patch;delete

// Options configure the controller; zero values take upstream's defaults.
type Options struct {
	// Workers is how many snapshots and contents are worked on at once (upstream: 10).
	Workers int
	// Resync re-lists every object this often (upstream: 15 min).
	Resync time.Duration
	// RetryStart and RetryMax bound the per-object exponential backoff (upstream: 1 s, 5 min).
	RetryStart, RetryMax time.Duration
}

func (o *Options) defaults() {
	if o.Workers <= 0 {
		o.Workers = 10
	}
	if o.Resync <= 0 {
		o.Resync = 15 * time.Minute
	}
	if o.RetryStart <= 0 {
		o.RetryStart = time.Second
	}
	if o.RetryMax <= 0 {
		o.RetryMax = 5 * time.Minute
	}
}

// Upstream's Event recorder writes snapshots' Events through client-go's scheme; added
// once, before any service's recorder reads it.
func init() { utilruntime.Must(snapscheme.AddToScheme(scheme.Scheme)) }

// Add runs the snapshot controller in mgr, as mgr's identity, while mgr leads.
func Add(mgr manager.Manager, o Options) error {
	o.defaults()
	cfg := mgr.GetConfig()
	snaps, err := snapclientset.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("snapshot controller: %w", err)
	}
	// Core kinds as protobuf, as upstream's binary asks for them.
	core := rest.CopyConfig(cfg)
	core.ContentType = runtime.ContentTypeProtobuf
	kube, err := kubernetes.NewForConfig(core)
	if err != nil {
		return fmt.Errorf("snapshot controller: %w", err)
	}
	// Upstream's operation metrics (snapshot_controller_*), served with the process's own.
	if err := serve(); err != nil {
		return fmt.Errorf("snapshot controller: registering its metrics: %w", err)
	}
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		// Made here, not in Add: upstream starts its Event broadcaster in the constructor,
		// and a controller that never runs (not the leader) must not hold one.
		mm := metrics.NewMetricsManager()
		var g prometheus.Gatherer = mm.GetRegistry()
		running.Store(&g)
		defer running.CompareAndSwap(&g, nil)
		sf := snapinformers.NewSharedInformerFactory(snaps, o.Resync)
		kf := informers.NewSharedInformerFactory(kube, o.Resync)
		backoff := func() workqueue.TypedRateLimiter[string] {
			return workqueue.NewTypedItemExponentialFailureRateLimiter[string](o.RetryStart, o.RetryMax)
		}
		ctrl := common.NewCSISnapshotCommonController(
			snaps, kube,
			sf.Snapshot().V1().VolumeSnapshots(),
			sf.Snapshot().V1().VolumeSnapshotContents(),
			sf.Snapshot().V1().VolumeSnapshotClasses(),
			nil, nil, nil, // group snapshots: off
			kf.Core().V1().PersistentVolumeClaims(),
			kf.Core().V1().PersistentVolumes(),
			nil, // nodes: distributed snapshotting is off
			mm,
			o.Resync,
			backoff(), backoff(), backoff(), backoff(),
			false, // distributed snapshotting
			true,  // prevent volume mode conversion, upstream's default since v7
			false, // group snapshots
		)
		sf.Start(ctx.Done())
		kf.Start(ctx.Done())
		var wg sync.WaitGroup
		ctrl.Run(o.Workers, ctx.Done(), &wg)
		wg.Wait()
		sf.Shutdown()
		kf.Shutdown()
		return nil
	}))
}
