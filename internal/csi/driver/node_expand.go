package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/mount-utils"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// NodeExpandVolume implements csi.NodeServer: it grows the volume where it is staged on
// this node, online. The target takes the new size once every healthy replica holds it
// (the operator grows them after ControllerExpandVolume; until then Unavailable, which the
// CO retries), the loop device re-reads its capacity, and a mount volume's file system
// grows in place (resize2fs for ext3/ext4, xfs_growfs on the mount point for xfs, as
// k8s.io/mount-utils runs them). volume_path is where the volume is staged or published
// here; a volume not staged here is FailedPrecondition. Repeating a call is harmless: a
// size the volume has already is OK.
func (d *Driver) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case req.GetVolumePath() == "":
		return nil, status.Error(codes.InvalidArgument, "volume path is required")
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
	if d.o.NodeID == "" {
		return nil, status.Error(codes.FailedPrecondition, "this driver instance serves no node")
	}
	id := req.GetVolumeId()
	if isInvalidName(id) {
		return nil, status.Errorf(codes.NotFound, "volume %s not found", id)
	}
	done, err := d.lockVolume(id)
	if err != nil {
		return nil, err
	}
	defer done()
	s := d.stagedVolume(id)
	if s == nil {
		if err := d.volumeExists(ctx, id); err != nil {
			return nil, err
		}
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged on node %s: it grows where it is staged", id, d.o.NodeID)
	}
	path, err := d.volumeAt(id, req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	vol, err := d.getVolume(ctx, id)
	if err != nil {
		return nil, err
	}
	spec, err := storagev1alpha1.Bytes(vol.Spec.Capacity)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: capacity: %v", id, err)
	}
	size := spec
	if required > 0 {
		size = roundUp(required)
	}
	if size > spec {
		return nil, status.Errorf(codes.OutOfRange, "volume %s is %s; it must be expanded to %s first (ControllerExpandVolume)", id, quantity(spec), quantity(size))
	}
	if cur := s.engine.Size(); limit > 0 && cur > limit {
		return nil, status.Errorf(codes.OutOfRange, "volume %s is %s; shrinking to %s is not supported", id, quantity(cur), quantity(limit))
	}
	block := loopDeviceOf(path) != "" || req.GetVolumeCapability().GetBlock() != nil
	if !block {
		// Refused before the volume changes: the file system could not follow.
		m, _, err := mountAt(path)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if err := OnlineResizeAvailable(m.fstype); err != nil {
			// Grown already when it was staged (growExtOffline): nothing left to do.
			if have, ferr := extBytes(d.node().fs.Exec, s.export.Device()); ferr == nil && have >= size {
				return &csi.NodeExpandVolumeResponse{CapacityBytes: s.engine.Size()}, nil
			}
			// FAILED_PRECONDITION is the CSI spec's "cannot grow while in use": a kubelet
			// retries once the volume is staged again, which grows it unmounted.
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s cannot grow on node %s while it is mounted: %v; it grows when it is next staged", id, d.o.NodeID, err)
		}
	}
	if size > s.engine.Size() {
		if err := s.engine.Grow(ctx, size); err != nil {
			// Most often a replica the operator has not grown yet: worth retrying.
			return nil, status.Errorf(codes.Unavailable, "volume %s: growing its target to %s: %v", id, quantity(size), err)
		}
	}
	grown := s.engine.Size()
	// Always: a call interrupted between the target and the loop device is finished here.
	if err := s.export.Resize(grown); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: presenting it at %s: %v", id, quantity(grown), err)
	}
	if !block {
		if _, err := mount.NewResizeFs(d.node().fs.Exec).Resize(s.export.Device(), path); err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: growing its file system at %s: %s", id, path, oneLine(err.Error()))
		}
	}
	d.log.Info("volume expanded on the node", "volume", id, "size", grown, "path", path)
	return &csi.NodeExpandVolumeResponse{CapacityBytes: grown}, nil
}
