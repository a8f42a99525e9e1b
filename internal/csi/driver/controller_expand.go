package driver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/target"
	"github.com/crdipc/crdipc/ipc"
)

// roundUp rounds a volume size up to whole sectors: a target serves only sizes that are a
// multiple of target.SectorSize.
func roundUp(n int64) int64 {
	if r := n % target.SectorSize; r != 0 {
		return n + target.SectorSize - r
	}
	return n
}

// roundDown rounds a size down to whole sectors.
func roundDown(n int64) int64 { return n - n%target.SectorSize }

// quantity spells n bytes as kubectl would ("128Mi").
func quantity(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }

// ControllerExpandVolume implements csi.ControllerServer. It raises the CStorVolume's
// spec.capacity (rounded up to whole sectors), which the operator turns into every replica
// growing, and waits, within the call's deadline, until every placed replica holds the new
// size (status.capacity). A volume is never shrunk: a request it already satisfies is OK
// with its current size, as the CSI spec asks; one whose limit is below the current size is
// OutOfRange. The node then has to grow the target and the file system
// (node_expansion_required), which NodeExpandVolume does where the volume is staged.
func (d *Driver) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case req.GetCapacityRange() == nil:
		return nil, status.Error(codes.InvalidArgument, "capacity range is required")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if msg := unsupported(c); msg != "" {
			return nil, status.Error(codes.InvalidArgument, msg)
		}
	}
	required, limit, err := expandRange(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	id := req.GetVolumeId()
	vol, err := d.getVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	have, err := storagev1alpha1.Bytes(vol.Spec.Capacity)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: capacity: %v", id, err)
	}
	if limit > 0 && have > limit {
		return nil, status.Errorf(codes.OutOfRange, "volume %s is %s; shrinking to %s is not supported", id, quantity(have), quantity(limit))
	}
	size := max(roundUp(required), have)
	if limit > 0 && size > limit {
		return nil, status.Errorf(codes.OutOfRange, "volume %s: %d bytes rounded up to whole %d-byte sectors (%d) exceed the limit of %d bytes", id, required, target.SectorSize, size, limit)
	}
	if size > have {
		if err := d.checkRoom(ctx, vol, size, have); err != nil {
			return nil, err
		}
		if vol, err = d.grow(ctx, vol, size); err != nil {
			return nil, err
		}
	}
	if err := d.awaitGrown(ctx, vol, size); err != nil {
		return nil, err
	}
	// The target where the volume is staged, and its file system, grow on the node; a block
	// volume needs that too (its loop device), so the node step is always required.
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: size, NodeExpansionRequired: true}, nil
}

// checkRoom refuses, before anything is written, a growth the pools of vol's replicas
// cannot hold: a capacity never shrinks, so a volume raised beyond its pools would stay
// unable to grow (the operator grows no replica until all fit). A pool smaller in total than
// size is OutOfRange (final: replicas do not move); one without the free room now is
// ResourceExhausted (retried). Free room is counted as the operator counts it: the pool's
// capacity less the capacity of every volume with a replica there. The operator's own check
// remains the authority (see awaitGrown).
func (d *Driver) checkRoom(ctx context.Context, vol *storagev1alpha1.CStorVolume, size, have int64) error {
	if len(vol.Status.Replicas) == 0 {
		return nil
	}
	var pools storagev1alpha1.CStorPoolList
	if err := d.c.List(ctx, &pools); err != nil {
		return apiError("listing pools", err)
	}
	var vols storagev1alpha1.CStorVolumeList
	if err := d.c.List(ctx, &vols); err != nil {
		return apiError("listing volumes", err)
	}
	used := map[string]int64{}
	for _, v := range vols.Items {
		n, err := storagev1alpha1.Bytes(v.Spec.Capacity)
		if err != nil {
			n = math.MaxInt64
		}
		for _, r := range v.Status.Replicas {
			if n > math.MaxInt64-used[r.Pool] {
				used[r.Pool] = math.MaxInt64 // saturated: full, never wrapped around to empty
			} else {
				used[r.Pool] += n
			}
		}
	}
	byName := map[string]*storagev1alpha1.CStorPool{}
	for i := range pools.Items {
		byName[pools.Items[i].Name] = &pools.Items[i]
	}
	var short []string
	for _, r := range vol.Status.Replicas {
		p := byName[r.Pool]
		if p == nil || !p.DeletionTimestamp.IsZero() {
			continue // a replica lost with its pool is replaced at the new size
		}
		total, err := storagev1alpha1.Bytes(p.Spec.Capacity)
		if err != nil {
			continue
		}
		if total < size {
			return status.Errorf(codes.OutOfRange, "volume %s cannot grow to %s: its replica %s is on pool %s, which holds %s in all", vol.Name, quantity(size), r.Name, p.Name, quantity(total))
		}
		if free := total - used[p.Name]; free < size-have {
			short = append(short, fmt.Sprintf("pool %s has %s free and replica %s needs %s more", p.Name, quantity(max(free, 0)), r.Name, quantity(size-have)))
		}
	}
	if len(short) > 0 {
		return status.Errorf(codes.ResourceExhausted, "volume %s cannot grow to %s now: %s", vol.Name, quantity(size), strings.Join(short, "; "))
	}
	return nil
}

// grow raises vol's spec.capacity to size with a merge patch of that one field. No
// optimistic lock: the operator's status writes would make it fail at every turn, and the
// API server refuses any shrink (the CRD's "may grow but not shrink") by itself, so a
// concurrent call that grew the volume further is found again and kept.
func (d *Driver) grow(ctx context.Context, vol *storagev1alpha1.CStorVolume, size int64) (*storagev1alpha1.CStorVolume, error) {
	base := vol.DeepCopy()
	vol.Spec.Capacity = *resource.NewQuantity(size, resource.BinarySI)
	err := d.c.Patch(ctx, vol, client.MergeFrom(base))
	switch {
	case err == nil:
		return vol, nil
	case apierrors.IsNotFound(err):
		return nil, status.Errorf(codes.NotFound, "volume %s not found", vol.Name)
	case invalidField(err, "spec.capacity"):
		cur := newVolume()
		if gerr := d.c.Get(ctx, d.volumeKey(vol.Name), cur); gerr != nil {
			return nil, apiError("reading volume", gerr)
		}
		if n, berr := storagev1alpha1.Bytes(cur.Spec.Capacity); berr == nil && n >= size {
			return cur, nil // grown further by a concurrent call
		}
		return nil, status.Errorf(codes.OutOfRange, "volume %s cannot grow to %d bytes: %v", vol.Name, size, err)
	default:
		return nil, apiError("growing volume", err)
	}
}

// errNoRoom ends awaitGrown when the operator finds a replica's pool too small.
var errNoRoom = errors.New("no room to grow")

// awaitGrown waits, within the caller's deadline less a margin, until the operator has seen
// vol's current spec and every placed replica holds size (status.capacity). A volume whose
// pools lack the room (Ready reason InsufficientCapacity) is ResourceExhausted at once with
// the operator's message; one still growing when the deadline comes is Aborted with it
// (the caller retries; the replicas keep growing meanwhile).
func (d *Driver) awaitGrown(ctx context.Context, vol *storagev1alpha1.CStorVolume, size int64) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(d.o.CreateTimeout)
	}
	margin := min(time.Until(deadline)/10, time.Second)
	actx, cancel := context.WithDeadline(ctx, deadline.Add(-margin))
	defer cancel()
	grown := func(o client.Object, s ipc.Status) (bool, error) {
		v := o.(*storagev1alpha1.CStorVolume)
		if v.Status.Capacity != nil {
			if n, err := storagev1alpha1.Bytes(*v.Status.Capacity); err == nil && n >= size {
				return true, nil
			}
		}
		if r := s.Condition(conditions.TypeReady); r != nil && r.Status != metav1.ConditionTrue && r.Reason == storagev1alpha1.ReasonInsufficientCapacity {
			return false, errNoRoom
		}
		return false, nil
	}
	err := ipc.Await(actx, d.c, vol, grown)
	var terr *ipc.TerminalError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errNoRoom):
		return status.Errorf(codes.ResourceExhausted, "volume %s: %s", vol.Name, readyMessage(vol, "a pool lacks the room"))
	case errors.As(err, &terr):
		return status.Errorf(codes.Internal, "volume %s: %s", vol.Name, terr.Message)
	case errors.Is(err, ipc.ErrDeleted):
		return status.Errorf(codes.NotFound, "volume %s was deleted while it was being expanded", vol.Name)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return status.Errorf(codes.Aborted, "volume %s is not grown to %s yet: %s", vol.Name, quantity(size), readyMessage(vol, "waiting for the storage operator"))
	default:
		return apiError("awaiting volume", err)
	}
}

// readyMessage is the message of vol's Ready condition, or def when it has none.
func readyMessage(vol *storagev1alpha1.CStorVolume, def string) string {
	if c := meta.FindStatusCondition(vol.Status.Conditions, conditions.TypeReady); c != nil && c.Message != "" {
		return c.Message
	}
	return def
}

// ControllerGetVolume implements csi.ControllerServer (GET_VOLUME): the volume as ListVolumes
// shows it, with the nodes it is published to.
func (d *Driver) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	vol, err := d.getVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	v, err := csiVolume(vol)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: v,
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{PublishedNodeIds: sortedKeys(published(vol))},
	}, nil
}

// getVolume reads volume id: InvalidArgument without an id, NotFound when there is none.
func (d *Driver) getVolume(ctx context.Context, id string) (*storagev1alpha1.CStorVolume, error) {
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	if isInvalidName(id) {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	}
	vol := newVolume()
	if err := d.c.Get(ctx, d.volumeKey(id), vol); apierrors.IsNotFound(err) {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	} else if err != nil {
		return nil, apiError("reading volume", err)
	}
	if !vol.DeletionTimestamp.IsZero() {
		return nil, status.Errorf(codes.NotFound, "volume %s not found (it is being deleted)", id)
	}
	return vol, nil
}

// expandRange is an expansion's capacity range, checked: not negative, required within the
// limit, and a whole number of sectors that large fits a byte count (the CRD admits < 8Ei).
func expandRange(r *csi.CapacityRange) (required, limit int64, err error) {
	required, limit = r.GetRequiredBytes(), r.GetLimitBytes()
	switch {
	case required < 0 || limit < 0:
		return 0, 0, status.Error(codes.InvalidArgument, "capacity must not be negative")
	case limit > 0 && required > limit:
		return 0, 0, status.Errorf(codes.InvalidArgument, "required bytes %d exceed limit bytes %d", required, limit)
	case required > math.MaxInt64-target.SectorSize:
		return 0, 0, status.Errorf(codes.OutOfRange, "capacity %d bytes is unsupported", required)
	}
	return required, limit, nil
}
