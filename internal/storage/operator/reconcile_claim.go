package operator

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/ipc"
)

// claimHandler keeps one CStorPool per eligible node for each StoragePoolClaim.
type claimHandler struct {
	c client.Client
	// live reads from the API server: deleting a pool must not rely on a cache that may
	// not show a replica created a moment ago.
	live client.Reader
}

// Handle implements ipc.Handler.
func (h *claimHandler) Handle(ctx context.Context, claim *storagev1alpha1.StoragePoolClaim) (ipc.Result, error) {
	var nodes corev1.NodeList
	if err := h.c.List(ctx, &nodes); err != nil {
		return ipc.Result{}, fmt.Errorf("listing nodes: %w", err)
	}
	var pools storagev1alpha1.CStorPoolList
	if err := h.c.List(ctx, &pools, client.MatchingFields{storagev1alpha1.FieldClaim: claim.Name}); err != nil {
		return ipc.Result{}, fmt.Errorf("listing pools: %w", err)
	}
	eligible := eligibleNodes(claim, nodes.Items)
	have := map[string]bool{}
	for _, p := range pools.Items {
		have[p.Spec.NodeName] = true
	}
	provisioned := int32(len(pools.Items))
	var collisions []string
	for _, node := range newPoolNodes(claim, eligible, have) {
		pool := newPool(claim, node)
		ipc.InjectTraceContext(ctx, pool)
		err := h.c.Create(ctx, pool)
		if apierrors.IsAlreadyExists(err) {
			// Another operator made it a moment ago (the cache does not show it yet) — or
			// the name is another pool's, and this node has none.
			var existing storagev1alpha1.CStorPool
			if err := h.live.Get(ctx, client.ObjectKeyFromObject(pool), &existing); err != nil {
				return ipc.Result{}, fmt.Errorf("reading pool %s: %w", pool.Name, err)
			}
			if existing.Spec.Claim != claim.Name || existing.Spec.NodeName != node {
				collisions = append(collisions, fmt.Sprintf("pool name %s for node %s is taken by the pool of claim %s on node %s",
					pool.Name, node, existing.Spec.Claim, existing.Spec.NodeName))
				continue
			}
		} else if err != nil {
			return ipc.Result{}, fmt.Errorf("creating pool %s: %w", pool.Name, err)
		}
		provisioned++
	}

	var healthy int32
	for _, p := range pools.Items {
		if p.Status.Phase == storagev1alpha1.PoolPhaseHealthy && p.DeletionTimestamp.IsZero() {
			healthy++
		}
	}
	desired := int32(len(eligible))
	if claim.Spec.MaxPools != nil {
		desired = min(desired, *claim.Spec.MaxPools)
	}
	claim.Status.DesiredPools, claim.Status.ProvisionedPools, claim.Status.HealthyPools = desired, provisioned, healthy
	if len(collisions) > 0 {
		// Terminal for this generation (a Warning Event, no retry loop); node and pool
		// changes call the handler again.
		return ipc.Result{}, ipc.Terminal("name collision: %s", strings.Join(collisions, "; "))
	}
	minPools := max(claim.Spec.MinPools, 1)
	if healthy >= minPools {
		return ipc.Done(fmt.Sprintf("%d of %d pools healthy", healthy, provisioned)), nil
	}
	return ipc.Waiting(conditions.ReasonWaiting,
		fmt.Sprintf("%d of minPools %d pools healthy (%d provisioned, %d eligible nodes)", healthy, minPools, provisioned, len(eligible)), 0), nil
}

// eligibleNodes are the nodes that may get a pool of claim: Ready, schedulable, not
// being deleted, matching the nodeSelector; sorted by name so every operator picks the
// same ones.
func eligibleNodes(claim *storagev1alpha1.StoragePoolClaim, nodes []corev1.Node) []string {
	sel := labels.SelectorFromSet(claim.Spec.NodeSelector)
	var names []string
	for i := range nodes {
		n := &nodes[i]
		if nodeIsReady(n) && !n.Spec.Unschedulable && n.DeletionTimestamp.IsZero() && sel.Matches(labels.Set(n.Labels)) {
			names = append(names, n.Name)
		}
	}
	slices.Sort(names)
	return names
}

// newPoolNodes are the eligible nodes without a pool that get one now, within maxPools.
func newPoolNodes(claim *storagev1alpha1.StoragePoolClaim, eligible []string, have map[string]bool) []string {
	room := -1 // unlimited
	if claim.Spec.MaxPools != nil {
		room = max(0, int(*claim.Spec.MaxPools)-len(have))
	}
	var out []string
	for _, n := range eligible {
		if room == 0 {
			break
		}
		if !have[n] {
			out = append(out, n)
			room--
		}
	}
	return out
}

func newPool(claim *storagev1alpha1.StoragePoolClaim, node string) *storagev1alpha1.CStorPool {
	return &storagev1alpha1.CStorPool{
		ObjectMeta: metav1.ObjectMeta{
			Name: storagev1alpha1.PoolName(claim.Name, node),
			// For `kubectl get csp -o wide`-style tree views and as a last resort: if the
			// claim's finalizer is removed by force, the garbage collector deletes the pools,
			// and the agents' finalizers still protect pools that hold replicas.
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: storagev1alpha1.GroupVersion.String(), Kind: "StoragePoolClaim",
				Name: claim.Name, UID: claim.UID, Controller: ptr.To(true),
			}},
		},
		Spec: storagev1alpha1.CStorPoolSpec{
			NodeName: node,
			Claim:    claim.Name,
			Capacity: claim.Spec.Capacity,
			PoolType: claim.Spec.PoolType,
			Backend:  claim.Spec.Backend,
		},
	}
}

// Finalize implements ipc.Finalizer: the claim's empty pools are deleted; pools holding
// replicas are kept, and the claim with them, until the replicas are gone.
func (h *claimHandler) Finalize(ctx context.Context, claim *storagev1alpha1.StoragePoolClaim) error {
	var pools storagev1alpha1.CStorPoolList
	if err := h.live.List(ctx, &pools, client.MatchingFields{storagev1alpha1.FieldClaim: claim.Name}); err != nil {
		return fmt.Errorf("listing pools: %w", err)
	}
	var held, deleting []string
	for i := range pools.Items {
		p := &pools.Items[i]
		if !p.DeletionTimestamp.IsZero() {
			if released, err := releaseAbandoned(ctx, h.c, h.live, p, p.Spec.NodeName); err != nil || !released {
				deleting = append(deleting, p.Name)
			}
			continue
		}
		var replicas storagev1alpha1.CStorVolumeReplicaList
		if err := h.live.List(ctx, &replicas, client.MatchingFields{storagev1alpha1.FieldPool: p.Name}, client.Limit(1)); err != nil {
			return fmt.Errorf("listing replicas of pool %s: %w", p.Name, err)
		}
		if len(replicas.Items) > 0 {
			held = append(held, p.Name)
			continue
		}
		uid := p.UID
		if err := h.c.Delete(ctx, p, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting pool %s: %w", p.Name, err)
		}
		deleting = append(deleting, p.Name)
	}
	if len(held) == 0 && len(deleting) == 0 {
		return nil
	}
	var parts []string
	if len(held) > 0 {
		parts = append(parts, fmt.Sprintf("pools holding replicas: %s", strings.Join(held, ", ")))
	}
	if len(deleting) > 0 {
		parts = append(parts, fmt.Sprintf("pools being deleted by their agents: %s", strings.Join(deleting, ", ")))
	}
	return ipc.Deleting("waiting for "+strings.Join(parts, "; "), 0)
}

// allClaims maps any change to every claim: a node concerns all of them.
func (h *claimHandler) allClaims(ctx context.Context, _ client.Object) []reconcile.Request {
	var list storagev1alpha1.StoragePoolClaimList
	if err := h.c.List(ctx, &list); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, c := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: c.Name}})
	}
	return reqs
}

// replicaToDeletingClaim maps a deleted replica to the claim of its pool when that claim
// is being deleted and may now be able to delete the pool.
func (h *claimHandler) replicaToDeletingClaim(ctx context.Context, o client.Object) []reconcile.Request {
	var pool storagev1alpha1.CStorPool
	if err := h.c.Get(ctx, types.NamespacedName{Name: o.(*storagev1alpha1.CStorVolumeReplica).Spec.Pool}, &pool); err != nil {
		return nil
	}
	var claim storagev1alpha1.StoragePoolClaim
	if err := h.c.Get(ctx, types.NamespacedName{Name: pool.Spec.Claim}, &claim); err != nil || claim.DeletionTimestamp.IsZero() {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: claim.Name}}}
}
