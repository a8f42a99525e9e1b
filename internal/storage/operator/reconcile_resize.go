package operator

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/ipc"
)

// growReplicas raises the spec.capacity of every replica of vol that is below size, the
// volume's capacity; the agents then grow the data. Growth is all or nothing: if a replica's
// pool has not the room, no replica grows (one that did could never shrink back) and the
// verdict says which pools are short. It returns that verdict, or nil once every replica
// asks for size.
func (h *volumeHandler) growReplicas(ctx context.Context, vol *storagev1alpha1.CStorVolume, size int64, replicas []storagev1alpha1.CStorVolumeReplica, v placement) (*ipc.Result, error) {
	var behind []*storagev1alpha1.CStorVolumeReplica
	for i := range replicas {
		r := &replicas[i]
		if n, err := storagev1alpha1.Bytes(r.Spec.Capacity); err == nil && n < size && r.DeletionTimestamp.IsZero() {
			behind = append(behind, r)
		}
	}
	if len(behind) == 0 {
		return nil, nil
	}
	used, err := h.poolUsage(ctx)
	if err != nil {
		return nil, err
	}
	var short []string
	for _, r := range behind {
		have, _ := storagev1alpha1.Bytes(r.Spec.Capacity)
		need := size - have
		p, ok := v.pools[r.Spec.Pool]
		if !ok {
			// The pool is gone: the replica is lost and replaceLost places a new one at the
			// new size; this one needs no room.
			continue
		}
		if free := poolFree(p, used); free < need {
			short = append(short, fmt.Sprintf("pool %s has %s free and replica %s needs %s more", p.Name, quantity(max(free, 0)), r.Name, quantity(need)))
		}
	}
	if len(short) > 0 {
		slices.Sort(short)
		return &ipc.Result{
			Reason:  storagev1alpha1.ReasonInsufficientCapacity,
			Message: fmt.Sprintf("cannot grow to %s: %s", quantity(size), strings.Join(short, "; ")),
		}, nil
	}
	for _, r := range behind {
		// A merge patch of the one field: the operator is the only writer of a replica's
		// spec, and writing the same size twice is harmless.
		base := r.DeepCopy()
		r.Spec.Capacity = *quantity(size)
		if err := h.c.Patch(ctx, r, client.MergeFrom(base)); err != nil {
			return nil, fmt.Errorf("growing replica %s to %s: %w", r.Name, quantity(size), err)
		}
	}
	return nil, nil
}

// resized sets vol's status.capacity to what every placed replica holds, and turns a Ready
// verdict into Resizing while some replica is still smaller than size.
func resized(vol *storagev1alpha1.CStorVolume, size int64, replicas []storagev1alpha1.CStorVolumeReplica, res ipc.Result) ipc.Result {
	held, grown := int64(-1), 0
	for i := range replicas {
		c := replicas[i].Status.Capacity
		if c == nil {
			continue
		}
		n, err := storagev1alpha1.Bytes(c.Total)
		if err != nil {
			continue
		}
		if held < 0 || n < held {
			held = n
		}
		if n >= size {
			grown++
		}
	}
	if held >= 0 {
		vol.Status.Capacity = quantity(min(held, size))
	}
	if !res.Ready || grown >= len(replicas) {
		return res
	}
	return ipc.Result{
		Reason:  storagev1alpha1.ReasonResizing,
		Message: fmt.Sprintf("growing to %s: %d of %d replicas grown", quantity(size), grown, len(replicas)),
	}
}
