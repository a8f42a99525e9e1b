package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/backend"
	"github.com/crdipc/crdipc/ipc"
)

// poolHandler creates, watches over and destroys the node's pools.
type poolHandler struct {
	node string
	c    client.Client
	// live reads from the API server, not the cache: the deletion guard must not miss
	// a replica created a moment ago.
	live     client.Reader
	backends func(storagev1alpha1.Backend) (backend.Backend, error)
	resync   time.Duration
}

// poolCreated reports whether a pool in this phase exists on disk (or did): from then
// on it is imported, never created again, because creating would replace its data.
func poolCreated(p storagev1alpha1.PoolPhase) bool {
	switch p {
	case storagev1alpha1.PoolPhaseHealthy, storagev1alpha1.PoolPhaseDegraded,
		storagev1alpha1.PoolPhaseOffline, storagev1alpha1.PoolPhaseError:
		return true
	}
	return false
}

func backendPool(p *storagev1alpha1.CStorPool) backend.Pool {
	return backend.Pool{Name: p.Name, Type: p.Spec.PoolType, Capacity: p.Spec.Capacity.Value()}
}

// Handle implements ipc.Handler.
func (h *poolHandler) Handle(ctx context.Context, pool *storagev1alpha1.CStorPool) (ipc.Result, error) {
	created := poolCreated(pool.Status.Phase)
	b, err := h.backends(pool.Spec.Backend)
	if err != nil {
		if !created {
			pool.Status.Phase = storagev1alpha1.PoolPhaseCreationFailed
		}
		return ipc.Result{}, ipc.Terminal("%v", err)
	}
	var st backend.PoolState
	if created {
		st, err = b.ImportPool(ctx, backendPool(pool))
		if err != nil {
			if ctx.Err() != nil {
				return ipc.Result{}, ctx.Err() // stopping: say nothing about the pool
			}
			pool.Status.Phase = storagev1alpha1.PoolPhaseOffline
			msg := fmt.Sprintf("pool is unusable on node %s: %v", h.node, err)
			if errors.Is(err, backend.ErrNotFound) {
				msg = fmt.Sprintf("pool is gone from node %s (%v); not re-creating it, that would replace its data", h.node, err)
			}
			return ipc.Result{Reason: conditions.ReasonDegraded, Message: msg, RequeueAfter: h.resync}, nil
		}
	} else {
		pool.Status.Phase = storagev1alpha1.PoolPhaseInit
		st, err = b.CreatePool(ctx, backendPool(pool))
		if err != nil {
			if ctx.Err() != nil {
				return ipc.Result{}, ctx.Err()
			}
			pool.Status.Phase = storagev1alpha1.PoolPhaseCreationFailed
			return ipc.Result{}, fmt.Errorf("creating pool: %w", err)
		}
	}
	pool.Status.Phase = storagev1alpha1.PoolPhaseHealthy
	if st.Degraded || st.Full {
		pool.Status.Phase = storagev1alpha1.PoolPhaseDegraded
	}
	pool.Status.Capacity = &storagev1alpha1.PoolCapacity{
		Total: *resource.NewQuantity(st.Total, resource.BinarySI),
		Used:  *resource.NewQuantity(st.Used, resource.BinarySI),
		Free:  *resource.NewQuantity(st.Free, resource.BinarySI),
	}
	if st.Full {
		// Degraded rather than failed: its replicas still serve reads, and nothing new is
		// placed on it (placement takes Healthy pools only) until space is freed.
		return ipc.Result{Reason: ReasonNoSpace, Message: fmt.Sprintf("the file system of pool %s on node %s is full (under 1 MiB available): writes to its replicas fail (ENOSPC)", st.Location, h.node), RequeueAfter: h.resync}, nil
	}
	if st.Degraded {
		return ipc.Result{Reason: conditions.ReasonDegraded, Message: fmt.Sprintf("pool %s on node %s is degraded", st.Location, h.node), RequeueAfter: h.resync}, nil
	}
	res := ipc.Done(fmt.Sprintf("pool %s on node %s", st.Location, h.node))
	res.RequeueAfter = h.resync
	return res, nil
}

// Finalize implements ipc.Finalizer: a pool that holds replicas stays, Ready=False/Deleting
// naming them; an empty pool's data is destroyed.
func (h *poolHandler) Finalize(ctx context.Context, pool *storagev1alpha1.CStorPool) error {
	var replicas storagev1alpha1.CStorVolumeReplicaList
	if err := h.live.List(ctx, &replicas, client.MatchingFields{storagev1alpha1.FieldPool: pool.Name}); err != nil {
		return fmt.Errorf("listing the pool's replicas: %w", err)
	}
	if n := len(replicas.Items); n > 0 {
		names := make([]string, 0, n)
		for _, r := range replicas.Items {
			names = append(names, r.Namespace+"/"+r.Name)
		}
		slices.Sort(names)
		if len(names) > 5 {
			names = append(names[:5], "…")
		}
		return ipc.Deleting(fmt.Sprintf("pool holds %d replica(s) (%s); it is deleted once they are", n, strings.Join(names, ", ")), 0)
	}
	b, err := h.backends(pool.Spec.Backend)
	if err == nil {
		err = b.DeletePool(ctx, backendPool(pool))
	}
	if err != nil {
		if ctx.Err() == nil {
			_ = h.setDeletionFailed(ctx, pool, fmt.Sprintf("deleting pool data failed: %v", err))
		}
		return fmt.Errorf("deleting pool: %w", err)
	}
	return nil
}

// setDeletionFailed reports, during deletion, why the finalizer stays.
func (h *poolHandler) setDeletionFailed(ctx context.Context, pool *storagev1alpha1.CStorPool, msg string) error {
	before := pool.Status.DeepCopy()
	pool.Status.Phase = storagev1alpha1.PoolPhaseDeletionFailed
	meta.SetStatusCondition(&pool.Status.Conditions, metav1.Condition{
		Type: conditions.TypeReady, Status: metav1.ConditionFalse, Reason: conditions.ReasonDeleting,
		Message: msg, ObservedGeneration: pool.Generation,
	})
	if equality.Semantic.DeepEqual(before, &pool.Status) {
		return nil
	}
	if err := h.c.Status().Update(ctx, pool); err != nil {
		return fmt.Errorf("writing pool status: %w", err)
	}
	return nil
}

// replicaToPool maps a replica to its pool.
func replicaToPool(_ context.Context, o client.Object) []reconcile.Request {
	r := o.(*storagev1alpha1.CStorVolumeReplica)
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: r.Spec.Pool}}}
}

// replicaGone passes only the deletion of a replica.
var replicaGone = predicate.Funcs{
	CreateFunc:  func(event.CreateEvent) bool { return false },
	UpdateFunc:  func(event.UpdateEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// poolPhaseChanged passes pools appearing, going and changing phase.
var poolPhaseChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*storagev1alpha1.CStorPool), e.ObjectNew.(*storagev1alpha1.CStorPool)
		return o.Status.Phase != n.Status.Phase || o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero()
	},
}
