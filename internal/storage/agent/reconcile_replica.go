package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/backend"
	"github.com/crdipc/crdipc/ipc"
)

// replicaHandler creates, watches over and destroys the node's replicas.
type replicaHandler struct {
	node     string
	c        client.Client
	live     client.Reader
	backends func(storagev1alpha1.Backend) (backend.Backend, error)
	resync   time.Duration
	// data is the node's replica data service; nil when the agent runs without one.
	data *dataServer
	// ready is told what each reconcile found (the agent's readiness); nil: nobody asks.
	ready *catchUp
}

// ReasonRebuilding: the replica is being filled from a healthy one (Ready=False, not terminal).
const ReasonRebuilding = "Rebuilding"

// ReasonNoSpace: the replica's writes fail because its pool's file system is full
// (ENOSPC). Not terminal: once space is freed the volume's target takes it back in and
// rebuilds it.
const ReasonNoSpace = "NoSpace"

// poolFull reports whether the pool handler found pool's file system full at its last look.
func poolFull(pool *storagev1alpha1.CStorPool) bool {
	ready := meta.FindStatusCondition(pool.Status.Conditions, conditions.TypeReady)
	return ready != nil && ready.Reason == ReasonNoSpace
}

// ReasonResizing: the replica's spec.capacity grew and growing its data failed (the pool
// has no room, the backend refused); it keeps serving its old size and growth is retried.
const ReasonResizing = "Resizing"

// rebuildPoll is how often a rebuilding replica's progress is brought into its status.
const rebuildPoll = time.Second

// replicaCreated reports whether a replica in this phase exists on disk (or did); like a
// pool, it is then only ever stat'ed, never created again.
func replicaCreated(p storagev1alpha1.ReplicaPhase) bool {
	return p == storagev1alpha1.ReplicaPhaseHealthy || p == storagev1alpha1.ReplicaPhaseOffline || p == storagev1alpha1.ReplicaPhaseRebuilding
}

func backendReplica(r *storagev1alpha1.CStorVolumeReplica) backend.Replica {
	return backend.Replica{Namespace: r.Namespace, Name: r.Name, Capacity: r.Spec.Capacity.Value()}
}

// Handle implements ipc.Handler.
func (h *replicaHandler) Handle(ctx context.Context, r *storagev1alpha1.CStorVolumeReplica) (ipc.Result, error) {
	unchecked := false
	res, err := h.handle(ctx, r, &unchecked)
	phase := r.Status.Phase
	if unchecked {
		phase = ""
	}
	h.ready.observe(r.UID, phase)
	return res, err
}

// handle reconciles r; *unchecked is set when the data service could not be asked, so the
// phase left in r's status is not known to be current.
func (h *replicaHandler) handle(ctx context.Context, r *storagev1alpha1.CStorVolumeReplica, unchecked *bool) (ipc.Result, error) {
	before, created := r.Status.Phase, replicaCreated(r.Status.Phase)
	offline := func(msg string) (ipc.Result, error) {
		r.Status.Phase = storagev1alpha1.ReplicaPhaseOffline
		return ipc.Result{Reason: conditions.ReasonDegraded, Message: msg, RequeueAfter: h.resync}, nil
	}
	var pool storagev1alpha1.CStorPool
	if err := h.c.Get(ctx, types.NamespacedName{Name: r.Spec.Pool}, &pool); err != nil {
		if !apierrors.IsNotFound(err) {
			return ipc.Result{}, err
		}
		if created {
			return offline(fmt.Sprintf("pool %s no longer exists on node %s", r.Spec.Pool, h.node))
		}
		r.Status.Phase = storagev1alpha1.ReplicaPhaseInit
		return ipc.Waiting(conditions.ReasonWaiting, fmt.Sprintf("waiting for pool %s on node %s", r.Spec.Pool, h.node), h.resync), nil
	}
	b, err := h.backends(pool.Spec.Backend)
	if err != nil {
		return ipc.Result{}, ipc.Terminal("%v", err)
	}
	var (
		st      backend.ReplicaState
		growErr error // growing to spec.capacity failed; the replica serves its old size
	)
	if created {
		st, err = b.StatReplica(ctx, backendPool(&pool), backendReplica(r))
		if err != nil {
			if ctx.Err() != nil {
				return ipc.Result{}, ctx.Err()
			}
			if errors.Is(err, backend.ErrNotFound) {
				return offline(fmt.Sprintf("replica is gone from pool %s (%v); not re-creating it, that would replace its data", pool.Name, err))
			}
			return offline(fmt.Sprintf("replica is unusable: %v", err))
		}
		if st.Size < r.Spec.Capacity.Value() {
			// spec.capacity grew (the volume is being expanded): grow the data, never shrink.
			grown, err := b.GrowReplica(ctx, backendPool(&pool), backendReplica(r))
			switch {
			case err == nil:
				st = grown
			case ctx.Err() != nil:
				return ipc.Result{}, ctx.Err()
			case errors.Is(err, backend.ErrNotFound):
				return offline(fmt.Sprintf("replica is gone from pool %s (%v); not re-creating it, that would replace its data", pool.Name, err))
			default:
				growErr = err
			}
		}
	} else {
		if pool.Status.Phase != storagev1alpha1.PoolPhaseHealthy && pool.Status.Phase != storagev1alpha1.PoolPhaseDegraded || !pool.DeletionTimestamp.IsZero() {
			r.Status.Phase = storagev1alpha1.ReplicaPhaseInit
			phase := pool.Status.Phase
			if phase == "" {
				phase = storagev1alpha1.PoolPhaseInit
			}
			return ipc.Waiting(conditions.ReasonWaiting, fmt.Sprintf("waiting for pool %s to be Healthy (it is %s)", pool.Name, phase), h.resync), nil
		}
		st, err = b.CreateReplica(ctx, backendPool(&pool), backendReplica(r))
		if err != nil {
			if ctx.Err() != nil {
				return ipc.Result{}, ctx.Err()
			}
			r.Status.Phase = storagev1alpha1.ReplicaPhaseError
			return ipc.Result{}, fmt.Errorf("creating replica: %w", err)
		}
	}
	r.Status.Phase = storagev1alpha1.ReplicaPhaseHealthy
	// Published so that tools and tests find the data without knowing the backend's layout.
	r.Status.Location = st.Location
	r.Status.Capacity = &storagev1alpha1.ReplicaCapacity{
		Total: *resource.NewQuantity(st.Size, resource.BinarySI),
		Used:  *resource.NewQuantity(st.Allocated, resource.BinarySI),
	}
	if h.data != nil {
		// Every time, not only after growing: the agent may have died between growing the
		// file and telling the data service, which keeps an open replica's size.
		if err := h.data.resize(storagev1alpha1.ReplicaDataID(r.Namespace, r.Name), st.Size); err != nil {
			*unchecked = true
			return ipc.Result{Reason: conditions.ReasonReconciling, Message: fmt.Sprintf("replica data service: %v", err), RequeueAfter: rebuildPoll}, nil
		}
		ds, err := h.reconcileData(ctx, r, poolFull(&pool))
		if err != nil {
			if ctx.Err() != nil {
				return ipc.Result{}, ctx.Err()
			}
			// The file is there; whether its data is current is not known yet. A replica
			// that was not Healthy is not called so until it is known to be: the volume
			// would count a new, empty one as a copy of its data.
			if before != storagev1alpha1.ReplicaPhaseHealthy && !h.data.current(r.UID) {
				r.Status.Phase = storagev1alpha1.ReplicaPhaseRebuilding
			}
			*unchecked = true
			return ipc.Result{Reason: conditions.ReasonReconciling, Message: err.Error(), RequeueAfter: rebuildPoll}, nil
		}
		// Housekeeping, not the replica's state: a failure is logged and tried at the next
		// resync.
		id := storagev1alpha1.ReplicaDataID(r.Namespace, r.Name)
		if self, err := h.data.client(ctx, h.data.endpoint, id); err == nil {
			if err := h.dropOrphanSnapshots(ctx, self, r); err != nil && ctx.Err() == nil {
				log.FromContext(ctx).Error(err, "snapshot copies", "replica", r.Name)
			}
		}
		if ds.noSpace != "" {
			r.Status.Phase = storagev1alpha1.ReplicaPhaseError
			return ipc.Result{
				Reason: ReasonNoSpace,
				Message: fmt.Sprintf("writes fail, the file system of pool %s on node %s is full (ENOSPC): %s; free space there and the volume's target rebuilds this replica",
					pool.Name, h.node, ds.noSpace),
				RequeueAfter: rebuildPoll,
			}, nil
		}
		if ds.rebuilding {
			r.Status.Phase = storagev1alpha1.ReplicaPhaseRebuilding
			return ipc.Result{Reason: ReasonRebuilding, Message: ds.message, RequeueAfter: rebuildPoll}, nil
		}
	}
	if growErr != nil {
		return ipc.Result{
			Reason: ReasonResizing,
			Message: fmt.Sprintf("growing to %s failed, serving %d bytes meanwhile; retrying: %v",
				r.Spec.Capacity.String(), st.Size, growErr),
			RequeueAfter: h.resync,
		}, nil
	}
	res := ipc.Done(fmt.Sprintf("replica %s on node %s", st.Location, h.node))
	res.RequeueAfter = h.resync
	return res, nil
}

// Finalize implements ipc.Finalizer: the replica's data is destroyed.
func (h *replicaHandler) Finalize(ctx context.Context, r *storagev1alpha1.CStorVolumeReplica) error {
	var pool storagev1alpha1.CStorPool
	if err := h.c.Get(ctx, types.NamespacedName{Name: r.Spec.Pool}, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			return nil // no pool, no data: a pool is destroyed only once it holds no replicas
		}
		return err
	}
	b, err := h.backends(pool.Spec.Backend)
	if err == nil {
		err = b.DeleteReplica(ctx, backendPool(&pool), backendReplica(r))
	}
	if err == nil {
		return nil
	}
	if ctx.Err() == nil {
		before := r.Status.DeepCopy()
		r.Status.Phase = storagev1alpha1.ReplicaPhaseDeletionFailed
		meta.SetStatusCondition(&r.Status.Conditions, metav1.Condition{
			Type: conditions.TypeReady, Status: metav1.ConditionFalse, Reason: conditions.ReasonDeleting,
			Message: fmt.Sprintf("deleting replica data failed: %v", err), ObservedGeneration: r.Generation,
		})
		if !equality.Semantic.DeepEqual(before, &r.Status) {
			_ = h.c.Status().Update(ctx, r)
		}
	}
	return fmt.Errorf("deleting replica: %w", err)
}

// poolToReplicas maps a pool to its replicas, from the cache.
func (h *replicaHandler) poolToReplicas(ctx context.Context, o client.Object) []reconcile.Request {
	var list storagev1alpha1.CStorVolumeReplicaList
	if err := h.c.List(ctx, &list, client.MatchingFields{storagev1alpha1.FieldPool: o.GetName()}); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, r := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&r)})
	}
	return reqs
}
