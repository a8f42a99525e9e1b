package driver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/ipc"
)

// VolumeID is the CStorVolume name (and CSI volume ID) for a CSI volume name. A name that is
// already a DNS label, such as the sidecar's pvc-<uid>, is used as is, so `kubectl get cv`
// shows which PVC a volume belongs to; any other name is hashed. Either way the mapping is a
// function of the name alone, which is what makes CreateVolume idempotent across restarts.
func VolumeID(name string) string {
	if len(validation.IsDNS1123Label(name)) == 0 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return "csi-" + hex.EncodeToString(sum[:16])
}

// CreateVolume implements csi.ControllerServer: it creates a CStorVolume named after
// req.Name (or finds the one an earlier call created) and awaits it Ready. While the
// operator is still placing replicas the call fails with Aborted — retryable, the volume is
// kept — and never reports a volume that is not there yet.
func (d *Driver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	source, err := sourceKey(req.GetVolumeContentSource())
	if err != nil {
		return nil, err
	}
	size, err := d.capacity(req.GetCapacityRange())
	if err != nil {
		return nil, err
	}
	rf, cf, err := parseParameters(req.GetParameters())
	if err != nil {
		return nil, err
	}
	fromBackup, backupKey, err := backupSource(req)
	if err != nil {
		return nil, err
	}
	if fromBackup != nil {
		source = backupKey
	}

	id := VolumeID(req.GetName())
	vol := newVolume()
	err = d.c.Get(ctx, d.volumeKey(id), vol)
	switch {
	case apierrors.IsNotFound(err):
		fill, err := d.fillSource(ctx, req.GetName(), req.GetVolumeContentSource(), size)
		if err != nil {
			return nil, err
		}
		vol = &storagev1alpha1.CStorVolume{
			ObjectMeta: metav1.ObjectMeta{
				Namespace:   d.o.Namespace,
				Name:        id,
				Annotations: map[string]string{AnnotationName: req.GetName()},
				Labels:      map[string]string{"app.kubernetes.io/managed-by": Name},
			},
			Spec: storagev1alpha1.CStorVolumeSpec{
				Capacity:          *resource.NewQuantity(size, resource.BinarySI),
				ReplicationFactor: rf,
				ConsistencyFactor: cf,
			},
		}
		switch {
		case fromBackup != nil:
			vol.Annotations[AnnotationContentSource] = source
			vol.Spec.Source = &storagev1alpha1.VolumeSource{Backup: fromBackup}
		case source != "":
			vol.Annotations[AnnotationContentSource] = source
			vol.Spec.Source = &storagev1alpha1.VolumeSource{Snapshot: fill}
		}
		// The claim's trace, when the call came in one, goes on with the operator.
		ipc.InjectTraceContext(ctx, vol)
		if err := d.c.Create(ctx, vol); apierrors.IsAlreadyExists(err) {
			// A concurrent call with the same name won: use its volume (compatible, below,
			// refuses it if it is another name's).
			vol = newVolume()
			if err := d.c.Get(ctx, d.volumeKey(id), vol); err != nil {
				return nil, apiError("reading volume", err)
			}
		} else if invalidField(err, "spec.capacity") {
			// Beyond what a CStorVolume may hold (the CRD admits less than 8Ei; a 16Ei
			// claim arrives clamped to 2^63-1 bytes): no pool could ever hold it.
			return nil, status.Errorf(codes.OutOfRange, "capacity %d bytes is unsupported: %v", size, err)
		} else if err != nil {
			return nil, apiError("creating volume", err)
		}
	case err != nil:
		return nil, apiError("reading volume", err)
	}
	if err := compatible(vol, req, size, rf, cf); err != nil {
		return nil, err
	}
	if have := vol.Annotations[AnnotationContentSource]; have != source {
		return nil, status.Errorf(codes.AlreadyExists, "volume %q exists with content source %q, the request asks for %q", req.GetName(), have, source)
	}
	if !vol.DeletionTimestamp.IsZero() {
		return nil, status.Errorf(codes.Aborted, "volume %s is still being deleted", id)
	}
	if err := d.awaitReady(ctx, vol); err != nil {
		return nil, err
	}
	if err := d.dropCloneSnapshot(ctx, vol); err != nil {
		// The clone is Ready; a DeleteVolume of it, or its next CreateVolume, tries again.
		d.log.Error(err, "clone ready")
	}
	v, err := csiVolume(vol)
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: v}, nil
}

// invalidField reports whether err is the API server refusing an object for field.
func invalidField(err error, field string) bool {
	var se *apierrors.StatusError
	if !apierrors.IsInvalid(err) || !errors.As(err, &se) || se.ErrStatus.Details == nil {
		return false
	}
	for _, c := range se.ErrStatus.Details.Causes {
		if c.Field == field {
			return true
		}
	}
	return false
}

// awaitReady waits for vol to be Ready within the caller's deadline, less a margin so the
// answer reaches the caller before it gives up on the call.
func (d *Driver) awaitReady(ctx context.Context, vol *storagev1alpha1.CStorVolume) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(d.o.CreateTimeout)
	}
	margin := time.Until(deadline) / 10
	if margin > time.Second {
		margin = time.Second
	}
	actx, cancel := context.WithDeadline(ctx, deadline.Add(-margin))
	defer cancel()
	err := ipc.Await(actx, d.c, vol, ipc.Ready)
	var terr *ipc.TerminalError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &terr):
		if terr.Reason != conditions.ReasonInvalidSpec {
			return status.Errorf(codes.Internal, "volume %s: %s", vol.Name, terr.Message)
		}
		if big, err := d.largerThanEveryPool(ctx, vol); err != nil {
			return err
		} else if !big {
			return status.Errorf(codes.InvalidArgument, "volume %s: %s", vol.Name, terr.Message)
		}
		// The operator refuses a volume no pool could ever hold, and it has placed
		// nothing. The caller takes OutOfRange as final and will not delete what it
		// never got, so the volume goes now rather than stay behind unclaimed.
		if err := d.deleteUnplaced(ctx, vol); err != nil {
			return err
		}
		return status.Errorf(codes.OutOfRange, "volume %s: %s", vol.Name, terr.Message)
	case errors.Is(err, ipc.ErrDeleted):
		return status.Errorf(codes.Aborted, "volume %s was deleted while it was being created", vol.Name)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		// Not a failure: the volume exists and the operator keeps placing its replicas (for
		// example until a node joins). Aborted tells the caller to retry the same name.
		msg := "waiting for the storage operator"
		if c := meta.FindStatusCondition(vol.Status.Conditions, conditions.TypeReady); c != nil && c.Message != "" {
			msg = c.Message
		}
		return status.Errorf(codes.Aborted, "volume %s is not ready yet: %s", vol.Name, msg)
	default:
		return apiError("awaiting volume", err)
	}
}

// largerThanEveryPool confirms the operator's verdict that vol is too large for any pool:
// its capacity exceeds that of every pool there is (the operator also counts the pools the
// claims will make, which the driver may not read).
func (d *Driver) largerThanEveryPool(ctx context.Context, vol *storagev1alpha1.CStorVolume) (bool, error) {
	size, err := storagev1alpha1.Bytes(vol.Spec.Capacity)
	if err != nil {
		return true, nil
	}
	var pools storagev1alpha1.CStorPoolList
	if err := d.c.List(ctx, &pools); err != nil {
		return false, apiError("listing pools", err)
	}
	for _, p := range pools.Items {
		if n, err := storagev1alpha1.Bytes(p.Spec.Capacity); err == nil && n >= size && p.DeletionTimestamp.IsZero() {
			return false, nil
		}
	}
	return true, nil
}

// deleteUnplaced deletes vol if it holds no replica and is published nowhere (a clone with
// the snapshot it was to be filled from). A volume that changed since it was read (a pool
// came, a replica was placed) is left alone and the call is to be retried (Aborted).
func (d *Driver) deleteUnplaced(ctx context.Context, vol *storagev1alpha1.CStorVolume) error {
	if len(vol.Status.Replicas) > 0 || len(published(vol)) > 0 || !vol.DeletionTimestamp.IsZero() {
		return nil
	}
	err := d.c.Delete(ctx, vol, client.Preconditions{UID: &vol.UID, ResourceVersion: &vol.ResourceVersion})
	switch {
	case err == nil, apierrors.IsNotFound(err):
		// A clone's snapshot of its source goes with it: the caller, told OutOfRange, never
		// deletes the volume, so nothing else would (Unavailable: the call is retried, and
		// DeleteVolume of a volume that is gone deletes it too).
		if err := d.dropCloneSnapshot(ctx, vol); err != nil {
			return status.Errorf(codes.Unavailable, "volume %s: %v", vol.Name, err)
		}
		return nil
	case apierrors.IsConflict(err):
		return status.Errorf(codes.Aborted, "volume %s changed while found too large for every pool; retry", vol.Name)
	default:
		return apiError("deleting the volume no pool can hold", err)
	}
}

func csiVolume(vol *storagev1alpha1.CStorVolume) (*csi.Volume, error) {
	rf := vol.Spec.EffectiveReplicationFactor()
	size, err := storagev1alpha1.Bytes(vol.Spec.Capacity)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: capacity: %v", vol.Name, err)
	}
	return &csi.Volume{
		VolumeId:      vol.Name,
		CapacityBytes: size,
		ContentSource: csiSource(vol),
		VolumeContext: map[string]string{
			ParamReplicaCount: strconv.Itoa(int(rf)),
			"namespace":       vol.Namespace,
		},
	}, nil
}

// DeleteVolume implements csi.ControllerServer. A missing volume is success; a published
// one is refused with FailedPrecondition. It waits, within the deadline, for the operator's
// finalizer to remove the replicas, so success means the data is gone.
func (d *Driver) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	}
	if isInvalidName(req.GetVolumeId()) {
		return &csi.DeleteVolumeResponse{}, nil // no such volume can exist
	}
	vol := newVolume()
	if err := d.c.Get(ctx, d.volumeKey(req.GetVolumeId()), vol); apierrors.IsNotFound(err) {
		if err := d.dropUnusedCloneSnapshots(ctx, req.GetVolumeId()); err != nil {
			return nil, err
		}
		return &csi.DeleteVolumeResponse{}, nil
	} else if err != nil {
		return nil, apiError("reading volume", err)
	}
	if nodes := published(vol); len(nodes) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is published to %s", vol.Name, strings.Join(sortedKeys(nodes), ", "))
	}
	// Snapshots are copies next to the replicas' data, deleted with them: the volume goes
	// only once they have (CSI lets a plugin whose snapshots depend on their volume refuse).
	if snaps, err := d.snapshotsOf(ctx, vol.Name); err != nil {
		return nil, err
	} else if len(snaps) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s has snapshots (%s): delete them first", vol.Name, strings.Join(snaps, ", "))
	}
	if err := d.dropCloneSnapshot(ctx, vol); err != nil {
		return nil, status.Errorf(codes.Unavailable, "volume %s: %v", vol.Name, err)
	}
	if vol.DeletionTimestamp.IsZero() {
		// The precondition makes the delete fail if a ControllerPublish recorded a node in
		// between: the resourceVersion we checked must be the one we delete.
		err := d.c.Delete(ctx, vol, client.Preconditions{UID: &vol.UID, ResourceVersion: &vol.ResourceVersion})
		if apierrors.IsNotFound(err) {
			return &csi.DeleteVolumeResponse{}, nil
		}
		if apierrors.IsConflict(err) {
			return nil, status.Errorf(codes.Aborted, "volume %s changed while being deleted; retry", vol.Name)
		}
		if err != nil {
			return nil, apiError("deleting volume", err)
		}
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(d.o.CreateTimeout)
	}
	actx, cancel := context.WithDeadline(ctx, deadline.Add(-time.Until(deadline)/10))
	defer cancel()
	never := func(client.Object, ipc.Status) (bool, error) { return false, nil }
	err := ipc.Await(actx, d.c, vol, never)
	if errors.Is(err, ipc.ErrDeleted) || apierrors.IsNotFound(err) {
		return &csi.DeleteVolumeResponse{}, nil
	}
	return nil, status.Errorf(codes.Aborted, "volume %s is still being deleted (its replicas are being removed)", vol.Name)
}
