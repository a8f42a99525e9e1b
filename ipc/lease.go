package ipc

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// DefaultLeaseNamespace holds receivers' heartbeat Leases.
const DefaultLeaseNamespace = "crdipc-system"

// LeaseName is the name of the heartbeat Lease of the receiver for gk.
func LeaseName(gk schema.GroupKind) string {
	return "receiver-" + strings.ToLower(gk.Kind) + "." + gk.Group
}

// ReceiverReady reports whether a live receiver for gk holds a fresh
// heartbeat Lease in namespace (DefaultLeaseNamespace when empty): one that
// names a holder and was renewed within its duration. A sender uses it
// before a time-critical call, where queueing a request for a receiver that
// is down would be worse than failing now (seed 000's transactional case).
func ReceiverReady(ctx context.Context, c client.Client, gk schema.GroupKind, namespace string) (bool, error) {
	if namespace == "" {
		namespace = DefaultLeaseNamespace
	}
	var l coordinationv1.Lease
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: LeaseName(gk)}, &l); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("reading receiver lease: %w", err)
	}
	return leaseFresh(&l, time.Now()), nil
}

func leaseFresh(l *coordinationv1.Lease, now time.Time) bool {
	s := l.Spec
	if s.HolderIdentity == nil || *s.HolderIdentity == "" || s.RenewTime == nil || s.LeaseDurationSeconds == nil {
		return false
	}
	return now.Before(s.RenewTime.Add(time.Duration(*s.LeaseDurationSeconds) * time.Second))
}

// heartbeat renews a receiver's Lease while the receiver runs (as leader,
// when leader election is on) and clears the holder on a clean stop, so
// ReceiverReady turns false at once instead of after the lease expires.
type heartbeat struct {
	c client.Client
	// r reads the Lease directly: a cached read would start an informer
	// on every Lease in the cluster, and need permission for that.
	r        client.Reader
	key      client.ObjectKey
	identity string
	duration time.Duration
}

func (h *heartbeat) NeedLeaderElection() bool { return true }

func (h *heartbeat) Start(ctx context.Context) error {
	tick := time.NewTicker(h.duration / 3)
	defer tick.Stop()
	for {
		if err := h.renew(ctx, &h.identity); err != nil && ctx.Err() == nil {
			// A missed renewal is not fatal: the next tick retries, and
			// the lease duration leaves room for two misses.
			logFromContext(ctx).Error(err, "renewing receiver lease", "lease", h.key)
		}
		select {
		case <-ctx.Done():
			stopCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = h.renew(stopCtx, nil)
			return nil
		case <-tick.C:
		}
	}
}

func (h *heartbeat) renew(ctx context.Context, holder *string) error {
	now := metav1.NewMicroTime(time.Now())
	var l coordinationv1.Lease
	err := h.r.Get(ctx, h.key, &l)
	if apierrors.IsNotFound(err) {
		if holder == nil {
			return nil
		}
		l = coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: h.key.Namespace, Name: h.key.Name},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       holder,
				LeaseDurationSeconds: ptr.To(int32(h.duration / time.Second)),
				AcquireTime:          &now,
				RenewTime:            &now,
			},
		}
		return h.c.Create(ctx, &l)
	}
	if err != nil {
		return err
	}
	if holder == nil {
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != h.identity {
			return nil // someone else holds it now; leave it
		}
		l.Spec.HolderIdentity = nil
	} else {
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != *holder {
			l.Spec.AcquireTime = &now
			l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
		}
		l.Spec.HolderIdentity = holder
		l.Spec.RenewTime = &now
		l.Spec.LeaseDurationSeconds = ptr.To(int32(h.duration / time.Second))
	}
	// Update carries resourceVersion: a concurrent writer makes this fail
	// with a conflict and the next tick retries from fresh state.
	return h.c.Update(ctx, &l)
}
