package driver

import (
	"context"
	"fmt"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// sourceKey is how AnnotationContentSource records a content source; "" for none.
func sourceKey(src *csi.VolumeContentSource) (string, error) {
	switch {
	case src == nil:
		return "", nil
	case src.GetSnapshot() != nil && src.GetSnapshot().GetSnapshotId() != "":
		return "snapshot:" + src.GetSnapshot().GetSnapshotId(), nil
	case src.GetVolume() != nil && src.GetVolume().GetVolumeId() != "":
		return "volume:" + src.GetVolume().GetVolumeId(), nil
	}
	return "", status.Error(codes.InvalidArgument, "volume content source: a snapshot id or a volume id is required")
}

// backupSource is the backup a CreateVolume request fills its volume from (ParamBackup), or
// nil; and its AnnotationContentSource key. A request has one content source.
func backupSource(req *csi.CreateVolumeRequest) (*storagev1alpha1.BackupRef, string, error) {
	v, ok := req.GetParameters()[ParamBackup]
	if !ok {
		return nil, "", nil
	}
	store, id, _ := strings.Cut(v, "/")
	if store == "" || id == "" || strings.Contains(id, "/") {
		return nil, "", status.Errorf(codes.InvalidArgument, "parameter %s=%q: want <store>/<backup id>", ParamBackup, v)
	}
	if req.GetVolumeContentSource() != nil {
		return nil, "", status.Errorf(codes.InvalidArgument, "parameter %s and a volume content source: a volume is filled from one source", ParamBackup)
	}
	return &storagev1alpha1.BackupRef{Store: store, ID: id}, "backup:" + v, nil
}

// csiSource is the content source recorded on vol, as CSI names it.
func csiSource(vol *storagev1alpha1.CStorVolume) *csi.VolumeContentSource {
	kind, id, ok := strings.Cut(vol.Annotations[AnnotationContentSource], ":")
	switch {
	case !ok:
		return nil
	case kind == "snapshot":
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
	case kind == "volume":
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
	}
	return nil
}

// cloneSnapshotName is the CSI name of the snapshot a clone named name is filled from.
func cloneSnapshotName(name string) string { return "clone-" + name }

// labelClone on the snapshot a clone is filled from is the clone's volume id: DeleteVolume
// of a clone whose CStorVolume was never made (CreateVolume cut short after the snapshot)
// finds the snapshot by it.
const labelClone = "csi.crdipc.io/clone"

// fillSource resolves the content source of a new volume of size bytes named name to the
// CStorVolumeSnapshot that fills it: a snapshot as it is; a volume (a clone) through a
// snapshot of it taken now, which the driver deletes once the clone is Ready.
func (d *Driver) fillSource(ctx context.Context, name string, src *csi.VolumeContentSource, size int64) (string, error) {
	if src == nil {
		return "", nil
	}
	if s := src.GetSnapshot(); s != nil {
		snap := &storagev1alpha1.CStorVolumeSnapshot{}
		err := d.c.Get(ctx, client.ObjectKey{Namespace: d.o.Namespace, Name: s.GetSnapshotId()}, snap)
		if apierrors.IsNotFound(err) || (err == nil && !snap.DeletionTimestamp.IsZero()) {
			return "", status.Errorf(codes.NotFound, "snapshot %s not found", s.GetSnapshotId())
		} else if err != nil {
			return "", apiError("reading snapshot", err)
		}
		if !snap.Status.ReadyToUse || snap.Status.Size == nil {
			return "", status.Errorf(codes.Unavailable, "snapshot %s is not ready to use yet", snap.Name)
		}
		if n, err := storagev1alpha1.Bytes(*snap.Status.Size); err != nil || n > size {
			return "", status.Errorf(codes.OutOfRange, "snapshot %s is %s, larger than the requested %d bytes", snap.Name, snap.Status.Size, size)
		}
		return snap.Name, nil
	}
	srcVol := newVolume()
	err := d.c.Get(ctx, d.volumeKey(src.GetVolume().GetVolumeId()), srcVol)
	if apierrors.IsNotFound(err) || (err == nil && !srcVol.DeletionTimestamp.IsZero()) {
		return "", status.Errorf(codes.NotFound, "volume %s not found", src.GetVolume().GetVolumeId())
	} else if err != nil {
		return "", apiError("reading volume", err)
	}
	if n, err := storagev1alpha1.Bytes(srcVol.Spec.Capacity); err != nil || n > size {
		return "", status.Errorf(codes.OutOfRange, "volume %s is %s, larger than the requested %d bytes", srcVol.Name, srcVol.Spec.Capacity.String(), size)
	}
	snap, err := d.snapshot(ctx, cloneSnapshotName(name), srcVol, map[string]string{labelClone: VolumeID(name)})
	if err != nil {
		return "", err
	}
	return snap.Name, nil
}

// dropCloneSnapshot deletes the snapshot a clone was filled from: once the clone is Ready,
// and when the clone is deleted before it ever was (nothing else would delete it, and it
// would keep its source volume from being deleted). Other volumes have none.
func (d *Driver) dropCloneSnapshot(ctx context.Context, vol *storagev1alpha1.CStorVolume) error {
	if !strings.HasPrefix(vol.Annotations[AnnotationContentSource], "volume:") || vol.Spec.Source == nil {
		return nil
	}
	if _, err := d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: vol.Spec.Source.Snapshot}); err != nil {
		return fmt.Errorf("deleting snapshot %s, which clone %s was filled from: %w", vol.Spec.Source.Snapshot, vol.Name, err)
	}
	return nil
}

// dropUnusedCloneSnapshots deletes the snapshots taken to fill clone id, a volume that does
// not exist: CreateVolume took the snapshot and was cut short before it made the volume, or
// the volume was deleted without them. Nothing else would delete them, and they would keep
// the clone's source from being deleted.
func (d *Driver) dropUnusedCloneSnapshots(ctx context.Context, id string) error {
	if len(validation.IsValidLabelValue(id)) > 0 {
		return nil // no volume id the driver gives is one: no snapshot carries it
	}
	var l storagev1alpha1.CStorVolumeSnapshotList
	if err := d.c.List(ctx, &l, client.InNamespace(d.o.Namespace), client.MatchingLabels{labelClone: id}); err != nil {
		return apiError("listing the snapshots taken for the clone", err)
	}
	for _, s := range l.Items {
		if _, err := d.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: s.Name}); err != nil {
			return status.Errorf(codes.Unavailable, "deleting snapshot %s, taken to fill clone %s: %v", s.Name, id, err)
		}
	}
	return nil
}

// snapshotsOf lists the snapshots of volume vol that are not being deleted.
func (d *Driver) snapshotsOf(ctx context.Context, vol string) ([]string, error) {
	var l storagev1alpha1.CStorVolumeSnapshotList
	if err := d.c.List(ctx, &l, client.InNamespace(d.o.Namespace), client.MatchingFields{storagev1alpha1.FieldVolume: vol}); err != nil {
		return nil, apiError("listing the volume's snapshots", err)
	}
	var names []string
	for _, s := range l.Items {
		if s.DeletionTimestamp.IsZero() {
			names = append(names, s.Name)
		}
	}
	return names, nil
}
