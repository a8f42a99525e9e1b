package driver

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// LinkName is what a target directory held where an earlier version of the driver, on a
// host that would not let it mount, published a replica file: NodeUnpublishVolume still
// removes it.
const LinkName = "crdipc-volume.img"

// NodeGetCapabilities implements csi.NodeServer: STAGE_UNSTAGE_VOLUME, since a mount volume
// is formatted and loop-mounted once per node (NodeStageVolume) and bind-mounted into each
// target (NodePublishVolume).
func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{Capabilities: []*csi.NodeServiceCapability{{
		Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME}},
	}}}, nil
}

// NodeGetInfo implements csi.NodeServer.
func (d *Driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	if d.o.NodeID == "" {
		return nil, status.Error(codes.FailedPrecondition, "this driver instance serves no node (start it with --node-id)")
	}
	return &csi.NodeGetInfoResponse{NodeId: d.o.NodeID}, nil
}

// NodePublishVolume implements csi.NodeServer: it makes the volume staged on this node
// available at the target path. Mount access bind-mounts the staging path (the mounted file
// system) onto the target directory, remounted read-only when asked. Block access
// bind-mounts the volume's loop device onto the target path.
func (d *Driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "target path is required")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "volume capability is required")
	}
	if msg := unsupported(req.GetVolumeCapability()); msg != "" {
		return nil, status.Error(codes.InvalidArgument, msg)
	}
	block := req.GetVolumeCapability().GetBlock() != nil
	if !block && req.GetStagingTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "staging target path is required for a mount volume: the driver stages it (STAGE_UNSTAGE_VOLUME)")
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
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged on node %s", id, d.o.NodeID)
	}
	target := req.GetTargetPath()
	if block {
		return &csi.NodePublishVolumeResponse{}, d.node().publishFile(s.export.Device(), target, req.GetReadonly())
	}
	return &csi.NodePublishVolumeResponse{}, d.publishMount(id, s.export.Device(), req.GetStagingTargetPath(), target, req.GetReadonly())
}

// volumeExists answers NotFound for a volume the API server does not know.
func (d *Driver) volumeExists(ctx context.Context, id string) error {
	if err := d.c.Get(ctx, d.volumeKey(id), newVolume()); apierrors.IsNotFound(err) {
		return status.Errorf(codes.NotFound, "volume %s not found", id)
	} else if err != nil {
		return apiError("reading volume", err)
	}
	return nil
}

// publishMount bind-mounts the staged file system (on dev) onto the target directory.
func (d *Driver) publishMount(id, dev, staging, target string, readonly bool) error {
	h := d.node()
	st, mounted, err := mountAt(staging)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if !mounted {
		return status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", id, staging)
	}
	if st.source != dev {
		return status.Errorf(codes.FailedPrecondition, "staging path %s holds %s, not volume %s", staging, st.source, id)
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return status.Errorf(codes.Internal, "creating target %s: %v", target, err)
	}
	if cur, ok, err := mountAt(target); err != nil {
		return status.Error(codes.Internal, err.Error())
	} else if ok {
		if cur.dev != st.dev || cur.root != st.root {
			return status.Errorf(codes.AlreadyExists, "target %s is already a mount point of %s", target, cur.source)
		}
		if cur.readonly != readonly {
			return status.Errorf(codes.AlreadyExists, "volume %s is already published at %s with readonly=%t", id, target, cur.readonly)
		}
		return nil
	}
	if err := h.mount(staging, target, "", unix.MS_BIND, ""); err != nil {
		return status.Errorf(codes.Internal, "bind-mounting %s on %s: %v", staging, target, err)
	}
	if readonly {
		if err := h.mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			_ = h.unmount(target, 0)
			return status.Errorf(codes.Internal, "remounting %s read-only: %v", target, err)
		}
	}
	return nil
}

// publishFile bind-mounts src onto dst, or links dst to src where mounting is not allowed.
// Publishing twice is a no-op.
func (h *host) publishFile(src, dst string, readonly bool) error {
	if cur, err := os.Readlink(dst); err == nil {
		if cur == src {
			return nil
		}
		return status.Errorf(codes.AlreadyExists, "%s is already published from %s", dst, cur)
	}
	if isMountPoint(dst) {
		return nil
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_RDONLY, 0o600)
	if err != nil && !errors.Is(err, unix.EISDIR) {
		return status.Errorf(codes.Internal, "creating %s: %v", dst, err)
	}
	if f != nil {
		_ = f.Close()
	}
	flags := uintptr(unix.MS_BIND)
	err = h.mount(src, dst, "", flags, "")
	if err == nil && readonly {
		if err = h.mount("", dst, "", flags|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			_ = h.unmount(dst, 0)
		}
	}
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EACCES) {
		return status.Errorf(codes.Internal, "bind-mounting %s on %s: %v", src, dst, err)
	}
	// No mount privilege (an unprivileged container, a laptop): link instead.
	_ = os.Remove(dst)
	if err := os.Symlink(src, dst); err != nil {
		return status.Errorf(codes.Internal, "linking %s to %s: %v", dst, src, err)
	}
	return nil
}

// NodeUnpublishVolume implements csi.NodeServer: it undoes NodePublishVolume; a target that
// is already gone is success.
func (d *Driver) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "target path is required")
	}
	done, err := d.lockVolume(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer done()
	h := d.node()
	target := req.GetTargetPath()
	// The target first: once it is unmounted, a LinkName inside it is ours, not the volume's.
	for _, p := range []string{target, filepath.Join(target, LinkName)} {
		for i := 0; isMountPoint(p); i++ {
			if i == maxUnmounts {
				return nil, status.Errorf(codes.Internal, "%s is still a mount point after %d unmounts", p, i)
			}
			if err := h.unmount(p, 0); errors.Is(err, unix.EINVAL) {
				break // not a mount point after all
			} else if err != nil {
				return nil, status.Errorf(codes.Internal, "unmounting %s: %v", p, err)
			}
		}
	}
	if err := os.Remove(filepath.Join(target, LinkName)); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ENOTDIR) {
		return nil, status.Errorf(codes.Internal, "removing %s: %v", target, err)
	}
	// The spec has the plugin remove the target path it published to: the block target
	// file or link, or the (now empty) mount directory.
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "removing %s: %v", target, err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// lockVolume marks a Node call on volume id as in flight and returns the function that ends
// it. A second call for the same volume meanwhile is Aborted, as the CSI spec suggests; the
// CO retries it.
func (d *Driver) lockVolume(id string) (func(), error) {
	d.nodeOps.Lock()
	defer d.nodeOps.Unlock()
	if d.nodeOps.busy[id] {
		return nil, status.Errorf(codes.Aborted, "another node operation on volume %s is in progress", id)
	}
	if d.nodeOps.busy == nil {
		d.nodeOps.busy = map[string]bool{}
	}
	d.nodeOps.busy[id] = true
	return func() {
		d.nodeOps.Lock()
		defer d.nodeOps.Unlock()
		delete(d.nodeOps.busy, id)
	}, nil
}
