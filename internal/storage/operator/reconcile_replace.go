package operator

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// DefaultReplaceAfter is how long a replica may stay Offline on a node that still exists
// (NotReady, its agent gone silent) before it is replaced: long enough for a reboot.
const DefaultReplaceAfter = 5 * time.Minute

// replaceLost deletes the replicas of vol that are lost — on a node that was deleted, or
// Offline for longer than h.replaceAfter — so that placement puts new ones on other pools,
// which their agents (or the volume's target) rebuild from a healthy replica. It acts only
// while another replica is Healthy: replacing the last copies would trade data for empty
// files. Stillborn replicas, which hold no data, are replaced whatever the others' state. Replicas already being deleted are released if their node is gone and left out of
// the count, so their replacements are placed meanwhile. It returns the replicas that
// remain and, when a replica is Offline but not lost yet, when to look again.
func (h *volumeHandler) replaceLost(ctx context.Context, vol *storagev1alpha1.CStorVolume, replicas []storagev1alpha1.CStorVolumeReplica, v placement) ([]storagev1alpha1.CStorVolumeReplica, time.Duration, error) {
	healthy := 0
	for i := range replicas {
		if replicaPhase(&replicas[i], v) == storagev1alpha1.ReplicaPhaseHealthy {
			healthy++
		}
	}
	var (
		kept  []storagev1alpha1.CStorVolumeReplica
		again time.Duration
	)
	for i := range replicas {
		r := &replicas[i]
		if !r.DeletionTimestamp.IsZero() {
			if _, err := releaseAbandoned(ctx, h.c, h.live, r, r.Spec.NodeName); err != nil {
				return nil, 0, err
			}
			continue
		}
		// A stillborn replica holds no data: it is replaced whatever the others' state.
		why := stillborn(r, v)
		if why == "" && healthy > 0 && replicaPhase(r, v) == storagev1alpha1.ReplicaPhaseOffline {
			lost, wait, reason, err := h.lost(ctx, r, v)
			if err != nil {
				return nil, 0, err
			}
			if lost {
				why = reason
			} else if wait > 0 && (again == 0 || wait < again) {
				again = wait
			}
		}
		if why == "" {
			kept = append(kept, *r)
			continue
		}
		uid := r.UID
		if err := h.c.Delete(ctx, r, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
			return nil, 0, fmt.Errorf("replacing replica %s: %w", r.Name, err)
		}
		h.log.Info("replacing a replica", "volume", client.ObjectKeyFromObject(vol), "replica", r.Name, "node", r.Spec.NodeName, "reason", why)
		if _, err := releaseAbandoned(ctx, h.c, h.live, r, r.Spec.NodeName); err != nil {
			return nil, 0, err
		}
	}
	return kept, again, nil
}

// stillborn says why replica r, not yet created on its pool (no agent has reported data
// for it), never will be: its pool is gone, being deleted, Offline or in Error. That
// happens when a pool's agent finds the pool's data gone only after the operator placed a
// replica on it, going by the status the pool's previous agent left. "" if it may still be
// created.
func stillborn(r *storagev1alpha1.CStorVolumeReplica, v placement) string {
	if r.Status.Location != "" || (r.Status.Phase != "" && r.Status.Phase != storagev1alpha1.ReplicaPhaseInit) {
		return ""
	}
	p, ok := v.pools[r.Spec.Pool]
	switch {
	case !ok:
		return fmt.Sprintf("pool %s is gone", r.Spec.Pool)
	case !p.DeletionTimestamp.IsZero():
		return fmt.Sprintf("pool %s is being deleted", p.Name)
	case p.Status.Phase == storagev1alpha1.PoolPhaseOffline || p.Status.Phase == storagev1alpha1.PoolPhaseError:
		return fmt.Sprintf("pool %s is %s", p.Name, p.Status.Phase)
	}
	return ""
}

// lost says whether replica r, Offline, is lost for good: its node was deleted (and no agent
// holds its Lease), or it has been Offline (its node NotReady, its pool or itself Offline)
// for h.replaceAfter. Otherwise wait is how long
// until it will be.
func (h *volumeHandler) lost(ctx context.Context, r *storagev1alpha1.CStorVolumeReplica, v placement) (lost bool, wait time.Duration, why string, err error) {
	gone, err := abandoned(ctx, h.c, h.live, r.Spec.NodeName)
	if err != nil {
		return false, 0, "", err
	}
	if gone {
		return true, 0, fmt.Sprintf("node %s was deleted", r.Spec.NodeName), nil
	}
	// Offline since the latest of what makes it so: its node's, pool's or own Ready
	// condition turning.
	var since time.Time
	consider := func(t time.Time) {
		if t.After(since) {
			since = t
		}
	}
	if n := v.nodes[r.Spec.NodeName]; n != nil && !nodeIsReady(n) {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				consider(c.LastTransitionTime.Time)
			}
		}
	}
	if p := v.pools[r.Spec.Pool]; p != nil && p.Status.Phase != storagev1alpha1.PoolPhaseHealthy && p.Status.Phase != storagev1alpha1.PoolPhaseDegraded {
		if c := meta.FindStatusCondition(p.Status.Conditions, conditions.TypeReady); c != nil {
			consider(c.LastTransitionTime.Time)
		}
	}
	if r.Status.Phase == storagev1alpha1.ReplicaPhaseOffline {
		if c := meta.FindStatusCondition(r.Status.Conditions, conditions.TypeReady); c != nil {
			consider(c.LastTransitionTime.Time)
		}
	}
	// Nor before the grace period has passed with this operator watching: after a restart
	// (of `up`, or a leader hand-over) nodes may still be coming back from what happened
	// while nobody looked.
	h.mu.Lock()
	consider(h.startedAt)
	h.mu.Unlock()
	if since.IsZero() {
		return false, h.replaceAfter, "", nil
	}
	if left := time.Until(since.Add(h.replaceAfter)); left > 0 {
		return false, left, "", nil
	}
	return true, 0, fmt.Sprintf("Offline for more than %s", h.replaceAfter), nil
}
