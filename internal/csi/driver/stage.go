package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/crdipc/crdipc/internal/storage/blockdev"
)

// fsTypes are the file systems NodeStageVolume makes on a replica file; the first is the
// default when the capability names none. One whose mkfs tool the node lacks is refused.
var fsTypes = []string{"ext4", "ext3", "xfs"}

// host is how the Node service changes the node: mount(2) and umount(2) for bind mounts,
// mount-utils (blkid, mkfs, fsck, mount(8), umount(8)) for the volume's file system, and
// available, which says whether the node can present a volume as a block device at all
// (FUSE and loop devices, see package blockdev). A unit test swaps it for a host that
// cannot.
type host struct {
	mount     func(source, target, fstype string, flags uintptr, data string) error
	unmount   func(target string, flags int) error
	fs        *mount.SafeFormatAndMount
	available func() error
}

// node returns the host the Node service acts on, building the real one on first use (building
// it runs umount(8) once, to learn how it reports a path that is not mounted).
func (d *Driver) node() *host {
	d.hostOnce.Do(func() {
		if d.host == nil {
			d.host = &host{
				mount:   unix.Mount,
				unmount: unix.Unmount,
				// Without systemd: mount(8) is run directly, not in a systemd-run scope.
				fs:        mount.NewSafeFormatAndMount(mount.NewWithoutSystemd(""), utilexec.New()),
				available: blockdev.Available,
			}
		}
	})
	return d.host
}

// NodeStageVolume implements csi.NodeServer. It starts the volume's target on this node — the
// engine that writes every replica and acknowledges at the consistency factor — and presents
// it as a loop device over a FUSE file (package blockdev), wherever the replicas live. Mount
// access then makes a file system on that device if it has none yet (blkid finds an
// existing one, which is never reformatted) and mounts it on the staging path with the
// capability's mount flags; block access stops at the device, which NodePublishVolume
// bind-mounts.
func (d *Driver) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	staging, fsType, err := d.checkStage(req)
	if err != nil {
		return nil, err
	}
	if d.o.NodeID == "" {
		return nil, status.Error(codes.FailedPrecondition, "this driver instance serves no node")
	}
	id := req.GetVolumeId()
	done, err := d.lockVolume(id)
	if err != nil {
		return nil, err
	}
	defer done()
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "creating staging path %s: %v", staging, err)
	}
	// Made now, so resolved now: a link swapped in on the way must not lead out.
	if staging, err = d.kubeletPath("staging target path", staging); err != nil {
		return nil, err
	}
	s := d.stagedVolume(id)
	if s == nil {
		// Nothing of ours may be mounted there: a mount left by an earlier driver process
		// is on a loop device whose FUSE server died with it.
		if m, mounted, err := mountAt(staging); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		} else if mounted {
			if !d.ours(id, m.source) {
				return nil, status.Errorf(codes.AlreadyExists, "staging path %s is already a mount point of %s, not of volume %s", staging, m.source, id)
			}
			if err := d.unmountAll(id, staging); err != nil {
				return nil, err
			}
		}
		if s, err = d.startTarget(ctx, id); err != nil {
			return nil, err
		}
		d.setStaged(id, s)
	}
	c := req.GetVolumeCapability()
	if c.GetBlock() != nil {
		return &csi.NodeStageVolumeResponse{}, nil
	}
	return &csi.NodeStageVolumeResponse{}, d.stageMount(id, s.export.Device(), staging, fsType, c.GetMount().GetMountFlags())
}

// checkStage refuses a NodeStageVolume request before anything on the node changes, and
// returns its staging path resolved inside the kubelet root and, for mount access, the file
// system to make.
func (d *Driver) checkStage(req *csi.NodeStageVolumeRequest) (staging, fsType string, err error) {
	switch {
	case req.GetVolumeId() == "":
		return "", "", status.Error(codes.InvalidArgument, "volume id is required")
	case req.GetStagingTargetPath() == "":
		return "", "", status.Error(codes.InvalidArgument, "staging target path is required")
	case req.GetVolumeCapability() == nil:
		return "", "", status.Error(codes.InvalidArgument, "volume capability is required")
	}
	c := req.GetVolumeCapability()
	if msg := unsupported(c); msg != "" {
		return "", "", status.Error(codes.InvalidArgument, msg)
	}
	if m := c.GetMount(); m != nil {
		if msg := checkMountFlags(m.GetMountFlags()); msg != "" {
			return "", "", status.Error(codes.InvalidArgument, msg)
		}
		var msg string
		if fsType, msg = d.node().fsType(m.GetFsType()); msg != "" {
			return "", "", status.Error(codes.InvalidArgument, msg)
		}
	}
	if staging, err = d.kubeletPath("staging target path", req.GetStagingTargetPath()); err != nil {
		return "", "", err
	}
	if isInvalidName(req.GetVolumeId()) {
		return "", "", status.Errorf(codes.NotFound, "volume %s not found", req.GetVolumeId())
	}
	return staging, fsType, nil
}

// ours reports whether a mount source is the loop device presenting volume id's target:
// one bound to a file in the volume's directory under the target directory.
func (d *Driver) ours(id, source string) bool {
	// A volume taken over from an earlier process of a container that has gone: sysfs
	// names its loop's backing file only as /volume (blockdev.Exists), but the running
	// export knows its device.
	if s := d.stagedVolume(id); s != nil && source != "" && s.export.Device() == source {
		return true
	}
	dir, err := d.targetDir(id)
	if err != nil {
		return false
	}
	backing := loopBackingFile(source)
	return backing != "" && within(backing, dir)
}

// stageMount formats dev as fsType unless it holds a file system, and mounts it on staging.
func (d *Driver) stageMount(id, dev, staging, fsType string, flags []string) error {
	h := d.node()
	m, mounted, err := mountAt(staging)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if mounted {
		if m.source != dev {
			return status.Errorf(codes.AlreadyExists, "staging path %s is already a mount point of %s, not of volume %s", staging, m.source, id)
		}
		if m.fstype != fsType {
			return status.Errorf(codes.AlreadyExists, "volume %s is already staged at %s as %s, not %s", id, staging, m.fstype, fsType)
		}
		return nil
	}
	have, err := h.fs.GetDiskFormat(dev)
	if err != nil {
		return status.Errorf(codes.Internal, "probing volume %s (%s) for a file system: %v", id, dev, err)
	}
	if have != "" && have != fsType {
		return status.Errorf(codes.FailedPrecondition, "volume %s holds %s, not the %s file system the capability asks for", id, have, fsType)
	}
	if strings.HasPrefix(have, "ext") && !slices.Contains(flags, "ro") {
		// Grown while mounted where it could not grow online: it grows now, unmounted.
		grown, err := growExtOffline(h.fs.Exec, dev)
		if err != nil {
			return status.Errorf(codes.Internal, "growing the file system of volume %s to its device's size: %v", id, err)
		}
		if grown {
			d.log.Info("file system grown at staging", "volume", id, "device", dev)
		}
	}
	// FormatAndMount runs blkid, then mkfs only when it found nothing (fsck -a otherwise),
	// then mount(8). nodev and nosuid: a volume's content is data, never a way into the node.
	opts := slices.Concat([]string{"nodev", "nosuid"}, flags)
	if fsType == "xfs" && !slices.Contains(opts, "nouuid") {
		// A clone or a restored snapshot is a copy of its source's blocks, the file system's
		// UUID included, and may be staged on the node where its source is: XFS refuses a
		// second mount of one UUID unless told nouuid.
		opts = append(opts, "nouuid")
	}
	err = h.fs.FormatAndMount(dev, staging, fsType, opts)
	if err == nil {
		return nil
	}
	var me mount.MountError
	if errors.As(err, &me) {
		switch me.Type {
		case mount.FormatFailed, mount.GetDiskFormatFailed, mount.HasFilesystemErrors:
			return status.Errorf(codes.Internal, "checking or making the file system of volume %s: %s", id, oneLine(me.Message))
		case mount.UnformattedReadOnly:
			return status.Errorf(codes.FailedPrecondition, "volume %s has no file system yet and the mount flags ask for read-only, so none can be made", id)
		}
	}
	return status.Errorf(codes.Internal, "mounting volume %s on %s: %s", id, staging, oneLine(err.Error()))
}

// NodeUnstageVolume implements csi.NodeServer: it flushes and unmounts the staging path, then
// stops the volume's target — the loop device and FUSE mount go, their connection ends even
// if another mount namespace still holds a copy of them, and every replica is closed cleanly.
// A mount there that is not one of this driver's volumes is refused, not unmounted; the
// staging directory itself is left to the CO, which created it. A volume that is not
// staged is success.
func (d *Driver) NodeUnstageVolume(_ context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case req.GetStagingTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path is required")
	}
	staging, err := d.kubeletPath("staging target path", req.GetStagingTargetPath())
	if err != nil {
		return nil, err
	}
	id := req.GetVolumeId()
	if isInvalidName(id) {
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	done, err := d.lockVolume(id)
	if err != nil {
		return nil, err
	}
	defer done()
	if err := d.syncStaging(id, staging); err != nil {
		return nil, err
	}
	if err := d.unmountAll(id, staging); err != nil {
		return nil, err
	}
	if err := d.stopTarget(id); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// syncStaging writes what the file system of volume id at staging holds through to its
// replicas before it is unmounted. The last unmount of a file system does that by itself,
// but where another mount namespace holds a copy of the mount, the unmount here is not the
// last one, and stopTarget then ends the connection under the copy.
func (d *Driver) syncStaging(id, staging string) error {
	s := d.stagedVolume(id)
	if s == nil {
		return nil // not served: nothing this process could flush
	}
	m, mounted, err := mountAt(staging)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if !mounted || m.source != s.export.Device() {
		return nil
	}
	fd, err := unix.Open(staging, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return status.Errorf(codes.Internal, "volume %s: opening its file system at %s to flush it: %v", id, staging, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return status.Errorf(codes.Internal, "volume %s: flushing its file system at %s to the replicas: %v", id, staging, err)
	}
	return nil
}

// unmountAll unmounts path until it is no mount point, refusing mounts that are not
// volume id's.
func (d *Driver) unmountAll(id, path string) error {
	h := d.node()
	for i := 0; ; i++ {
		m, mounted, err := mountAt(path)
		if err != nil {
			return status.Error(codes.Internal, err.Error())
		}
		if !mounted {
			return nil
		}
		if i == maxUnmounts {
			return status.Errorf(codes.Internal, "%s is still a mount point after %d unmounts", path, i)
		}
		if !d.ours(id, m.source) {
			return status.Errorf(codes.FailedPrecondition, "%s is a mount point of %s, which is not crdipc volume %s: not unmounting it", path, m.source, id)
		}
		if err := h.fs.Unmount(path); err != nil {
			return status.Errorf(codes.Internal, "unmounting %s: %s", path, oneLine(err.Error()))
		}
	}
}

// maxUnmounts bounds the unmounts of one path in one call (mounts can be stacked).
const maxUnmounts = 8

// fsType returns the file system to make for the requested type, or why it cannot.
func (h *host) fsType(requested string) (string, string) {
	// unsupported has refused types other than fsTypes already.
	t := requested
	if t == "" {
		t = fsTypes[0]
	}
	if _, err := h.fs.Exec.LookPath("mkfs." + t); err != nil {
		return "", fmt.Sprintf("file system type %s is not supported on this node: it has no mkfs.%s", t, t)
	}
	return t, ""
}

// checkMountFlags says why mount flags are refused, or "" when they are fine. A flag changes
// how the file system is mounted, never what: the driver loop-mounts the whole replica file.
func checkMountFlags(flags []string) string {
	for _, f := range flags {
		name, _, _ := strings.Cut(f, "=")
		switch {
		case f == "" || strings.ContainsAny(f, ", \t\n"):
			return fmt.Sprintf("mount flag %q is not a single mount option", f)
		case slices.Contains([]string{"bind", "rbind", "remount", "move", "loop", "offset", "sizelimit"}, name):
			return fmt.Sprintf("mount flag %q is not allowed: the driver decides what is mounted", f)
		case slices.Contains([]string{"dev", "suid", "defaults"}, name):
			// They would undo the nodev,nosuid every volume is mounted with.
			return fmt.Sprintf("mount flag %q is not allowed: volumes are mounted nodev,nosuid", f)
		}
	}
	return ""
}

// oneLine joins the lines of a tool's message.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}
