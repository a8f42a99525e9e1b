package driver

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/target"
)

// Reasons of the health entries the driver reports (CSI VolumeHealth, which replaced the
// VolumeCondition of NodeGetVolumeStats in CSI 1.13).
const (
	// HealthOffline: fewer than consistencyFactor replicas are healthy; writes cannot be
	// acknowledged.
	HealthOffline = "Offline"
	// HealthError: the operator reports the volume in error.
	HealthError = "Error"
	// HealthDegraded: the volume serves I/O with fewer healthy replicas than it should have.
	HealthDegraded = "Degraded"
	// HealthRebuilding: a replica is being filled from a healthy one.
	HealthRebuilding = "Rebuilding"
	// HealthReplicaFaulted: the target on this node cannot reach a replica.
	HealthReplicaFaulted = "ReplicaFaulted"
)

// volumeHealth is what is known to be wrong with vol: what the operator reports in its
// status and, when s is the volume's target on this node, how that target sees the
// replicas. No entry: nothing is wrong.
func volumeHealth(vol *storagev1alpha1.CStorVolume, s *staged) *csi.VolumeHealth {
	h := &csi.VolumeHealth{VolumeId: vol.Name}
	// The spec allows one entry per (status, reason): more of one kind share it.
	add := func(t csi.VolumeHealthErrorType, reason, msg string) {
		for _, e := range h.HealthStatuses {
			if e.Status == t && e.Reason == reason {
				e.Message += "; " + msg
				return
			}
		}
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{Status: t, Reason: reason, Message: msg})
	}
	desired := vol.Status.DesiredReplicas
	if desired == 0 {
		desired = vol.Spec.EffectiveReplicationFactor()
	}
	healthy := fmt.Sprintf("%d of %d replicas healthy", vol.Status.ReadyReplicas, desired)
	switch vol.Status.Phase {
	case storagev1alpha1.VolumePhaseOffline:
		add(csi.VolumeHealthErrorType_INACCESSIBLE, HealthOffline, fmt.Sprintf("%s, fewer than the consistency factor %d: %s", healthy, vol.Spec.EffectiveConsistencyFactor(), readyMessage(vol, "writes cannot be acknowledged")))
	case storagev1alpha1.VolumePhaseError:
		add(csi.VolumeHealthErrorType_INACCESSIBLE, HealthError, readyMessage(vol, "the storage operator reports the volume in error"))
	case storagev1alpha1.VolumePhaseDegraded:
		add(csi.VolumeHealthErrorType_DEGRADED, HealthDegraded, fmt.Sprintf("%s: %s", healthy, readyMessage(vol, "the missing ones are placed when pools become available")))
	}
	for _, r := range vol.Status.Replicas {
		if r.Phase == storagev1alpha1.ReplicaPhaseRebuilding {
			add(csi.VolumeHealthErrorType_DEGRADED, HealthRebuilding, fmt.Sprintf("replica %s on node %s is being rebuilt", r.Name, r.Node))
		}
	}
	if s == nil {
		return h
	}
	states := s.engine.States()
	ids := make([]string, 0, len(states))
	for id := range states {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		switch st := states[id]; st.State {
		case target.Rebuilding:
			add(csi.VolumeHealthErrorType_DEGRADED, HealthRebuilding, fmt.Sprintf("the target on this node rebuilds replica %s (%d of %d bytes copied)", id, st.RebuildDone, st.RebuildTotal))
		case target.Faulted:
			msg := fmt.Sprintf("the target on this node does not reach replica %s", id)
			if st.Err != nil {
				msg += ": " + st.Err.Error()
			}
			add(csi.VolumeHealthErrorType_DEGRADED, HealthReplicaFaulted, msg)
		}
	}
	return h
}

// ControllerGetVolumeHealth implements csi.ControllerServer (GET_VOLUME_HEALTH): the
// volume's health as the storage operator reports it.
func (d *Driver) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	vol, err := d.getVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: volumeHealth(vol, nil)}, nil
}

// NodeGetVolumeHealth implements csi.NodeServer (GET_VOLUME_HEALTH): the volume's health as
// the operator reports it and, where the volume is staged on this node, as its target sees
// the replicas. It answers for a volume that is not staged here too, as the spec allows, so
// a volume that could not be staged says why.
func (d *Driver) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	vol, err := d.getVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: volumeHealth(vol, d.stagedVolume(vol.Name))}, nil
}

// NodeGetVolumeStats implements csi.NodeServer (GET_VOLUME_STATS), what kubelet's
// kubelet_volume_stats_* metrics come from. volume_path must be where the volume is staged
// or published on this node: for a mount volume the bytes and inodes of its file system
// (statfs, as df counts them), for a block volume the size of its device.
func (d *Driver) NodeGetVolumeStats(_ context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case req.GetVolumePath() == "":
		return nil, status.Error(codes.InvalidArgument, "volume path is required")
	}
	id := req.GetVolumeId()
	path, err := d.volumeAt(id, req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	if loopDeviceOf(path) != "" { // block access: the device node itself
		size, err := deviceSize(path)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: the size of %s: %v", id, path, err)
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}}, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: statfs %s: %v", id, path, err)
	}
	bsize := int64(st.Bsize)
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: int64(st.Blocks) * bsize, Available: int64(st.Bavail) * bsize, Used: int64(st.Blocks-st.Bfree) * bsize},
		{Unit: csi.VolumeUsage_INODES, Total: int64(st.Files), Available: int64(st.Ffree), Used: int64(st.Files - st.Ffree)},
	}}, nil
}

// volumeAt returns path, resolved inside the driver's roots, when it is where volume id is
// staged or published on this node; otherwise NotFound, as the CSI spec has it for a
// volume that "does not exist on the specified path".
func (d *Driver) volumeAt(id, path string) (string, error) {
	if isInvalidName(id) || d.stagedVolume(id) == nil {
		return "", status.Errorf(codes.NotFound, "volume %s is not staged on node %s", id, d.o.NodeID)
	}
	p, err := d.kubeletPath("volume path", path)
	if err != nil {
		return "", status.Errorf(codes.NotFound, "volume %s is not at %s: %s", id, path, status.Convert(err).Message())
	}
	m, mounted, err := mountAt(p)
	if err != nil {
		return "", status.Error(codes.Internal, err.Error())
	}
	if !mounted || !d.published(id, m, p) {
		return "", status.Errorf(codes.NotFound, "volume %s is not at %s: it is neither staged nor published there", id, path)
	}
	return p, nil
}

// deviceSize is the size in bytes of the block device at path.
func deviceSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	// Seeking to the end of a block device yields its size.
	return f.Seek(0, io.SeekEnd)
}
