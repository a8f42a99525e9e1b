package driver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/crdipc/crdipc/internal/storage/backend"
)

// LinkName is the entry NodePublishVolume creates in a mount-type target directory when the
// host does not let the driver mount: a symbolic link to the node's replica file.
const LinkName = "crdipc-volume.img"

// NodeGetCapabilities implements csi.NodeServer. No STAGE_UNSTAGE: a file-backed replica
// needs no per-node staging, so NodeStage/NodeUnstage are not offered.
func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

// NodeGetInfo implements csi.NodeServer.
func (d *Driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	if d.o.NodeID == "" {
		return nil, status.Error(codes.FailedPrecondition, "this driver instance serves no node (start it with --node-id)")
	}
	return &csi.NodeGetInfoResponse{NodeId: d.o.NodeID}, nil
}

// NodePublishVolume implements csi.NodeServer: it makes this node's replica of the volume
// available at the target path. Block access bind-mounts the replica file onto the target
// path; mount access bind-mounts it onto LinkName inside the target directory. Where
// mount(2) is refused (EPERM/EACCES: no CAP_SYS_ADMIN) the same path becomes a symbolic link
// to the replica file instead. Formatting the replica and loop-mounting a file system is
// not done on any host.
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
	if d.o.NodeID == "" {
		return nil, status.Error(codes.FailedPrecondition, "this driver instance serves no node")
	}
	src, err := d.replicaFile(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	target := req.GetTargetPath()
	if req.GetVolumeCapability().GetBlock() != nil {
		return &csi.NodePublishVolumeResponse{}, publishFile(src, target, req.GetReadonly())
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "creating target %s: %v", target, err)
	}
	return &csi.NodePublishVolumeResponse{}, publishFile(src, filepath.Join(target, LinkName), req.GetReadonly())
}

// publishFile bind-mounts src onto dst, or links dst to src where mounting is not allowed.
// Publishing twice is a no-op.
func publishFile(src, dst string, readonly bool) error {
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
	err = unix.Mount(src, dst, "", flags, "")
	if err == nil && readonly {
		err = unix.Mount("", dst, "", flags|unix.MS_REMOUNT|unix.MS_RDONLY, "")
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

// isMountPoint reports whether path is a mount point. It reads the mount table: a bind
// mount of a file on the same file system has the same device number as its parent, so
// comparing stat results would miss it.
func isMountPoint(path string) bool {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		// Field 5 is the mount point, with space, tab, newline and backslash octal-escaped.
		if len(f) > 4 && unescapeMountPath(f[4]) == path {
			return true
		}
	}
	return false
}

func unescapeMountPath(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
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
	target := req.GetTargetPath()
	for _, p := range []string{filepath.Join(target, LinkName), target} {
		if isMountPoint(p) {
			if err := unix.Unmount(p, 0); err != nil && !errors.Is(err, unix.EINVAL) {
				return nil, status.Errorf(codes.Internal, "unmounting %s: %v", p, err)
			}
		}
	}
	if err := os.Remove(filepath.Join(target, LinkName)); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTDIR) {
		return nil, status.Errorf(codes.Internal, "removing %s: %v", target, err)
	}
	// The spec has the plugin remove the target path it published to: the block target
	// file or link, or the (now empty) mount directory.
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "removing %s: %v", target, err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// replicaFile is this node's replica file of the volume.
func (d *Driver) replicaFile(ctx context.Context, id string) (string, error) {
	if isInvalidName(id) {
		return "", status.Errorf(codes.NotFound, "volume %s not found", id)
	}
	vol := newVolume()
	if err := d.c.Get(ctx, d.volumeKey(id), vol); apierrors.IsNotFound(err) {
		return "", status.Errorf(codes.NotFound, "volume %s not found", id)
	} else if err != nil {
		return "", apiError("reading volume", err)
	}
	for _, r := range vol.Status.Replicas {
		if r.Node == d.o.NodeID {
			f := backend.NewFile(d.o.Root).ReplicaPath(r.Pool, backend.Replica{Namespace: vol.Namespace, Name: r.Name})
			if _, err := os.Stat(f); err != nil {
				return "", status.Errorf(codes.Unavailable, "replica %s of volume %s: %v", r.Name, id, err)
			}
			return f, nil
		}
	}
	return "", status.Errorf(codes.FailedPrecondition, "volume %s has no replica on node %s", id, d.o.NodeID)
}
