package operator

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/ipc"
)

// Finalizers of the operator: a StoragePoolClaim stays until its pools are deleted, a
// CStorVolume until its replicas are.
const (
	ClaimFinalizer  = "storage.crdipc.io/claim"
	VolumeFinalizer = "storage.crdipc.io/volume"
)

// The operator's permissions: the claims and volumes it serves (and deletes, for
// ttlSecondsAfterFinished), the pools and replicas it creates and deletes (update/patch
// only to release the agent finalizer of a deleted node nobody serves), Nodes to read,
// Events, and the Leases of leader election, the receiver heartbeats and the pool agents
// (read, to tell whether a node is abandoned).
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=storagepoolclaims;cstorvolumes,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=storagepoolclaims/status;cstorvolumes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorpools;cstorvolumereplicas,verbs=get;list;watch;create;delete;update;patch
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=cstorvolumesnapshots,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete,namespace=crdipc-system

// Options configure the operator.
type Options struct {
	// Receiver is the template for the operator's two ipc receivers (identity, lease,
	// concurrency, backoff); Name, Finalizer and Watches are set by the operator.
	Receiver ipc.Options
	// ReplaceAfter is how long a replica may stay Offline on a node that still exists before
	// it is replaced on another pool (a deleted node's replicas are replaced at once);
	// default DefaultReplaceAfter.
	ReplaceAfter time.Duration
	// PruneInterval is how often each BackupStore's unreferenced chunks are pruned; default
	// DefaultPruneInterval.
	PruneInterval time.Duration
	// StoreSync is how often each BackupStore is opened again, its backups listed (those
	// found become VolumeBackups) and its retention applied; default DefaultStoreSync.
	StoreSync time.Duration
}

// Register adds the operator's receivers for StoragePoolClaims and CStorVolumes to mgr.
func Register(mgr manager.Manager, o Options) error {
	ctx := context.Background()
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &storagev1alpha1.CStorPool{}, storagev1alpha1.FieldClaim, func(o client.Object) []string {
		return []string{o.(*storagev1alpha1.CStorPool).Spec.Claim}
	}); err != nil {
		return fmt.Errorf("indexing pools by claim: %w", err)
	}
	if err := idx.IndexField(ctx, &storagev1alpha1.CStorVolumeReplica{}, storagev1alpha1.FieldVolume, func(o client.Object) []string {
		return []string{o.(*storagev1alpha1.CStorVolumeReplica).Spec.Volume}
	}); err != nil {
		return fmt.Errorf("indexing replicas by volume: %w", err)
	}

	if o.Receiver.BackoffBase == 0 {
		// Conflicts on status writes (the cache a write behind) are retried through the
		// rate limiter; ipc's 100 ms first retry would dominate a volume's latency.
		o.Receiver.BackoffBase = 5 * time.Millisecond
	}
	if err := mgr.Add(&caKeeper{r: mgr.GetAPIReader(), w: mgr.GetClient(), log: mgr.GetLogger().WithName("storage-data-ca")}); err != nil {
		return err
	}
	if err := addCSRController(mgr); err != nil {
		return fmt.Errorf("storage data certificate controller: %w", err)
	}
	claims := &claimHandler{c: mgr.GetClient(), live: mgr.GetAPIReader()}
	co := o.Receiver
	co.Name, co.Finalizer = "storagepoolclaim", ClaimFinalizer
	co.Watches = []ipc.Watch{
		// A node joining, leaving or changing labels or readiness changes the pools a
		// claim should have.
		{Object: &corev1.Node{}, Map: claims.allClaims, Predicates: []predicate.Predicate{nodeChanged}},
		// Pool phases make up the claim's status.
		{Object: &storagev1alpha1.CStorPool{}, Map: poolToClaim, Predicates: []predicate.Predicate{poolChanged}},
		// A claim being deleted waits for its pools' replicas to go.
		{Object: &storagev1alpha1.CStorVolumeReplica{}, Map: claims.replicaToDeletingClaim, Predicates: []predicate.Predicate{deleteOnly}},
	}
	if err := ipc.Register(mgr, &storagev1alpha1.StoragePoolClaim{}, ipc.Handler[*storagev1alpha1.StoragePoolClaim](claims), co); err != nil {
		return err
	}

	if o.ReplaceAfter <= 0 {
		o.ReplaceAfter = DefaultReplaceAfter
	}
	volumes := &volumeHandler{c: mgr.GetClient(), live: mgr.GetAPIReader(), log: mgr.GetLogger().WithName("cstorvolume"), replaceAfter: o.ReplaceAfter, usage: newUsageTracker()}
	replicaInformer, err := mgr.GetCache().GetInformer(context.Background(), &storagev1alpha1.CStorVolumeReplica{})
	if err != nil {
		return fmt.Errorf("replica informer: %w", err)
	}
	reg, err := replicaInformer.AddEventHandler(volumes.usage.handler())
	if err != nil {
		return fmt.Errorf("replica usage handler: %w", err)
	}
	volumes.usage.synced = reg.HasSynced
	if err := mgr.Add(volumes); err != nil {
		return err
	}
	vo := o.Receiver
	vo.Name, vo.Finalizer = "cstorvolume", VolumeFinalizer
	// A volume's replicas carry its controller reference: a volume deleted before its
	// finalizer is stored still loses them, to the garbage collector. Storing the finalizer
	// alongside the placement takes one write off a new volume's way to Ready.
	vo.OwnedEffects = true
	vo.Watches = []ipc.Watch{
		// Replica phases make up the volume's status.
		{Object: &storagev1alpha1.CStorVolumeReplica{}, Map: replicaToVolume, Predicates: []predicate.Predicate{replicaChanged}},
		// A pool appearing (or turning Healthy) places the replicas volumes wait for; a
		// pool going Offline degrades the volumes with replicas on it.
		{Object: &storagev1alpha1.CStorPool{}, Map: volumes.poolToVolumes, Predicates: []predicate.Predicate{poolChanged}},
		// A node going NotReady, coming back or being deleted changes its replicas' state.
		{Object: &corev1.Node{}, Map: volumes.nodeToVolumes, Predicates: []predicate.Predicate{nodeChanged}},
		// A restored volume is placed once its source snapshot exists and is ready to use.
		{Object: &storagev1alpha1.CStorVolumeSnapshot{}, Map: volumes.snapshotToVolumes, Predicates: []predicate.Predicate{snapshotChanged}},
	}
	if err := ipc.Register(mgr, &storagev1alpha1.CStorVolume{}, ipc.Handler[*storagev1alpha1.CStorVolume](volumes), vo); err != nil {
		return err
	}
	return registerBackups(mgr, o)
}

// registerBackups adds the receivers of BackupStores and VolumeBackups.
func registerBackups(mgr manager.Manager, o Options) error {
	if o.PruneInterval <= 0 {
		o.PruneInterval = DefaultPruneInterval
	}
	if o.StoreSync <= 0 {
		o.StoreSync = DefaultStoreSync
	}
	// Each store's sync opens it again: an opened store is reused for two of its syncs.
	opened := &repos{maxAge: 2 * o.StoreSync}
	stores := &storeHandler{c: mgr.GetClient(), live: mgr.GetAPIReader(), pruneEvery: o.PruneInterval, sync: o.StoreSync, repos: opened}
	so := o.Receiver
	so.Name, so.Finalizer = "backupstore", ""
	if err := ipc.Register(mgr, &storagev1alpha1.BackupStore{}, ipc.Handler[*storagev1alpha1.BackupStore](stores), so); err != nil {
		return err
	}
	backups := &backupHandler{c: mgr.GetClient(), live: mgr.GetAPIReader(), repos: opened}
	bo := o.Receiver
	bo.Name, bo.Finalizer = "volumebackup", BackupFinalizer
	// The VolumeSnapshot a backup takes is owned by it: deleted with it.
	bo.OwnedEffects = true
	bo.Watches = []ipc.Watch{
		// The uploading agent ending or failing the upload.
		{Object: &storagev1alpha1.VolumeBackup{}, Map: backupToSelf, Predicates: []predicate.Predicate{backupProgressed}},
		// A store opening lets its waiting backups go on.
		{Object: &storagev1alpha1.BackupStore{}, Map: backups.storeToBackups},
	}
	return ipc.Register(mgr, &storagev1alpha1.VolumeBackup{}, ipc.Handler[*storagev1alpha1.VolumeBackup](backups), bo)
}

func poolToClaim(_ context.Context, o client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.(*storagev1alpha1.CStorPool).Spec.Claim}}}
}

func replicaToVolume(_ context.Context, o client.Object) []reconcile.Request {
	r := o.(*storagev1alpha1.CStorVolumeReplica)
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: r.Namespace, Name: r.Spec.Volume}}}
}

// poolChanged passes pools appearing, going, and changing phase or capacity.
var poolChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*storagev1alpha1.CStorPool), e.ObjectNew.(*storagev1alpha1.CStorPool)
		return o.Status.Phase != n.Status.Phase || o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero() ||
			!o.Spec.Capacity.Equal(n.Spec.Capacity)
	},
}

// replicaChanged passes replicas appearing, going, and changing phase, data endpoint (which
// the volume's status carries to its target), location (which it shows) or size (which
// ends a resize).
var replicaChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*storagev1alpha1.CStorVolumeReplica), e.ObjectNew.(*storagev1alpha1.CStorVolumeReplica)
		return o.Status.Phase != n.Status.Phase || o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero() ||
			o.Status.Endpoint != n.Status.Endpoint || o.Status.Location != n.Status.Location ||
			!replicaTotal(o).Equal(replicaTotal(n))
	},
}

// nodeChanged passes what decides whether a node gets pools: existence, labels,
// readiness, schedulability.
var nodeChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
		return !equality.Semantic.DeepEqual(o.Labels, n.Labels) || nodeIsReady(o) != nodeIsReady(n) ||
			o.Spec.Unschedulable != n.Spec.Unschedulable || o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero()
	},
}

var deleteOnly = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	UpdateFunc:  func(event.UpdateEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

func nodeIsReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// replicaTotal is the replica's size as its agent last measured it; zero before it did.
func replicaTotal(r *storagev1alpha1.CStorVolumeReplica) resource.Quantity {
	if r.Status.Capacity == nil {
		return resource.Quantity{}
	}
	return r.Status.Capacity.Total
}
