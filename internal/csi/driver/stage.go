package driver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
)

// fsTypes are the file systems NodeStageVolume makes on a replica file; the first is the
// default when the capability names none. One whose mkfs tool the node lacks is refused.
var fsTypes = []string{"ext4", "ext3", "xfs"}

// host is how the Node service changes the node: mount(2) and umount(2) for bind mounts and
// for trying whether it may mount at all, and mount-utils (blkid, mkfs, fsck, mount(8) -o loop
// and umount(8)) for the replica's file system. A unit test swaps it for a host that refuses
// to mount.
type host struct {
	mount       func(source, target, fstype string, flags uintptr, data string) error
	unmount     func(target string, flags int) error
	fs          *mount.SafeFormatAndMount
	loopControl string
}

// node returns the host the Node service acts on, building the real one on first use (building
// it runs umount(8) once, to learn how it reports a path that is not mounted).
func (d *Driver) node() *host {
	d.hostOnce.Do(func() {
		if d.host == nil {
			d.host = &host{
				mount:   unix.Mount,
				unmount: unix.Unmount,
				// Without systemd: mount(8) is run directly, not in a systemd-run scope;
				// a loop mount needs no helper process to outlive the driver.
				fs:          mount.NewSafeFormatAndMount(mount.NewWithoutSystemd(""), utilexec.New()),
				loopControl: "/dev/loop-control",
			}
		}
	})
	return d.host
}

// NodeStageVolume implements csi.NodeServer. Block access needs no staging: nothing is done
// or recorded, and NodePublishVolume publishes the replica file itself. Mount access makes a
// file system on this node's replica file if it has none yet (blkid finds an existing one,
// which is never reformatted) and loop-mounts it on the staging path with the capability's
// mount flags. Where the host refuses to mount (see host.refused) the file system is still
// made, since mkfs on a file needs no privilege, but not mounted: the staging path gets
// LinkName, a symbolic link to the replica file, instead.
func (d *Driver) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case req.GetStagingTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path is required")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "volume capability is required")
	}
	c := req.GetVolumeCapability()
	if msg := unsupported(c); msg != "" {
		return nil, status.Error(codes.InvalidArgument, msg)
	}
	if d.o.NodeID == "" {
		return nil, status.Error(codes.FailedPrecondition, "this driver instance serves no node")
	}
	var fsType string
	if m := c.GetMount(); m != nil {
		var msg string
		if fsType, msg = d.node().fsType(m.GetFsType()); msg != "" {
			return nil, status.Error(codes.InvalidArgument, msg)
		}
		if msg := checkMountFlags(m.GetMountFlags()); msg != "" {
			return nil, status.Error(codes.InvalidArgument, msg)
		}
	}
	done, err := d.lockVolume(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer done()
	src, err := d.replicaFile(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if c.GetBlock() != nil {
		return &csi.NodeStageVolumeResponse{}, nil
	}
	return &csi.NodeStageVolumeResponse{}, d.stageMount(req.GetVolumeId(), src, req.GetStagingTargetPath(), fsType, c.GetMount().GetMountFlags())
}

// stageMount formats src as fsType unless it holds a file system and loop-mounts it on
// staging, or links staging/LinkName to it where the host refuses to mount.
func (d *Driver) stageMount(id, src, staging, fsType string, flags []string) error {
	h := d.node()
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return status.Errorf(codes.Internal, "creating staging path %s: %v", staging, err)
	}
	// Already staged? The mount table first: a link inside a mounted file system is the
	// volume's content, not ours.
	m, mounted, err := mountAt(staging)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if mounted {
		if !sameFile(loopBackingFile(m.source), src) {
			return status.Errorf(codes.AlreadyExists, "staging path %s is already a mount point of %s, not of volume %s", staging, m.source, id)
		}
		if m.fstype != fsType {
			return status.Errorf(codes.AlreadyExists, "volume %s is already staged at %s as %s, not %s", id, staging, m.fstype, fsType)
		}
		return nil
	}
	link := filepath.Join(staging, LinkName)
	cur, linkErr := os.Readlink(link)
	if linkErr == nil && !sameFile(cur, src) {
		return status.Errorf(codes.AlreadyExists, "staging path %s already links to %s, not to volume %s", staging, cur, id)
	}
	have, err := h.fs.GetDiskFormat(src)
	if err != nil {
		return status.Errorf(codes.Internal, "probing the replica %s of volume %s for a file system: %v", src, id, err)
	}
	if linkErr == nil { // staged earlier on a host that refused to mount
		if have != fsType {
			return status.Errorf(codes.AlreadyExists, "volume %s is already staged at %s holding %q, not %s", id, staging, have, fsType)
		}
		return nil
	}
	if have != "" && have != fsType {
		return status.Errorf(codes.FailedPrecondition, "volume %s holds %s, not the %s file system the capability asks for", id, have, fsType)
	}
	// FormatAndMount runs blkid, then mkfs only when it found nothing (fsck -a otherwise),
	// then mount(8) with -o loop, which sets up a loop device with autoclear: unmounting
	// releases it.
	err = h.fs.FormatAndMount(src, staging, fsType, append([]string{"loop"}, flags...))
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
	why := h.refused(staging)
	if why == "" {
		return status.Errorf(codes.Internal, "loop-mounting volume %s on %s: %s", id, staging, oneLine(err.Error()))
	}
	// A host without mount privileges: the file system is made, the mount is skipped.
	d.log.Info("staging without a mount: this host refuses to loop-mount, linking the replica file instead",
		"volume", id, "stagingPath", staging, "reason", why, "mountError", oneLine(err.Error()))
	if err := os.Symlink(src, link); err != nil {
		return status.Errorf(codes.Internal, "linking %s to %s: %v", link, src, err)
	}
	return nil
}

// NodeUnstageVolume implements csi.NodeServer: it unmounts the staging path (umount(8); the
// loop device, set up with autoclear, is released with the last unmount) and removes the
// fallback link. The staging directory itself is left to the CO, which created it, and a
// mount there that is not a loop mount of a crdipc replica is refused, not unmounted. A
// volume that is not staged is success.
func (d *Driver) NodeUnstageVolume(_ context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case req.GetStagingTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "staging target path is required")
	}
	done, err := d.lockVolume(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer done()
	staging := req.GetStagingTargetPath()
	h := d.node()
	for i := 0; ; i++ {
		m, mounted, err := mountAt(staging)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if !mounted {
			break
		}
		if i == maxUnmounts {
			return nil, status.Errorf(codes.Internal, "%s is still a mount point after %d unmounts", staging, i)
		}
		if backing := loopBackingFile(m.source); backing == "" || !within(backing, d.poolsDir()) {
			return nil, status.Errorf(codes.FailedPrecondition, "staging path %s is a mount point of %s, which is not a crdipc replica: not unmounting it", staging, m.source)
		}
		if err := h.fs.Unmount(staging); err != nil {
			return nil, status.Errorf(codes.Internal, "unmounting %s: %s", staging, oneLine(err.Error()))
		}
	}
	link := filepath.Join(staging, LinkName)
	if fi, err := os.Lstat(link); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, status.Errorf(codes.Internal, "removing %s: %v", link, err)
		}
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// maxUnmounts bounds the unmounts of one path in one call (mounts can be stacked).
const maxUnmounts = 8

// poolsDir is the directory holding this node's replica files.
func (d *Driver) poolsDir() string {
	dir, err := filepath.Abs(filepath.Join(d.o.Root, "pools"))
	if err != nil {
		return filepath.Join(d.o.Root, "pools")
	}
	return dir
}

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
		}
	}
	return ""
}

// refused says why this process may not loop-mount, or "" when nothing says it may not. It
// tries: a bind mount of dir onto itself (undone at once) fails with EPERM or EACCES without
// CAP_SYS_ADMIN, and the loop control device cannot be opened where there are no loop
// devices for the process (a container without them).
func (h *host) refused(dir string) string {
	err := h.mount(dir, dir, "", unix.MS_BIND, "")
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return fmt.Sprintf("mount(2) is refused: %v", err)
	}
	if err != nil {
		return ""
	}
	// A lazy unmount of the probe: it cannot be busy.
	_ = h.unmount(dir, unix.MNT_DETACH)
	f, err := os.OpenFile(h.loopControl, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
		return fmt.Sprintf("no loop device: %v", err)
	}
	if err == nil {
		_ = f.Close()
	}
	return ""
}

// oneLine joins the lines of a tool's message.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}
