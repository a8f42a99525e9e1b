package driver

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// LinkName is what a target directory held where an earlier version of the driver, on a
// host that would not let it mount, published a replica file: NodeUnpublishVolume still
// removes it when it is a symbolic link.
const LinkName = "crdipc-volume.img"

// NodeGetCapabilities implements csi.NodeServer: STAGE_UNSTAGE_VOLUME, since a mount volume
// is formatted and loop-mounted once per node (NodeStageVolume) and bind-mounted into each
// target (NodePublishVolume); GET_VOLUME_STATS and GET_VOLUME_HEALTH for kubelet's volume
// metrics and health; EXPAND_VOLUME, since the staged target and the file system grow here.
func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
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
// system) onto the target directory, nodev and nosuid, remounted read-only when asked. Block
// access bind-mounts the volume's loop device onto the target path, nosuid.
func (d *Driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	staging, target, err := d.checkPublish(req)
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
	s := d.stagedVolume(id)
	if s == nil {
		if err := d.volumeExists(ctx, id); err != nil {
			return nil, err
		}
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged on node %s", id, d.o.NodeID)
	}
	if req.GetVolumeCapability().GetBlock() != nil {
		return &csi.NodePublishVolumeResponse{}, d.publishBlock(id, s.export.Device(), target, req.GetReadonly())
	}
	return &csi.NodePublishVolumeResponse{}, d.publishMount(id, s.export.Device(), staging, target, req.GetReadonly())
}

// checkPublish refuses a NodePublishVolume request before anything on the node changes,
// and returns its staging path ("" for block access) and target path resolved inside the
// kubelet root.
func (d *Driver) checkPublish(req *csi.NodePublishVolumeRequest) (staging, target string, err error) {
	switch {
	case req.GetVolumeId() == "":
		return "", "", status.Error(codes.InvalidArgument, "volume id is required")
	case req.GetTargetPath() == "":
		return "", "", status.Error(codes.InvalidArgument, "target path is required")
	case req.GetVolumeCapability() == nil:
		return "", "", status.Error(codes.InvalidArgument, "volume capability is required")
	}
	c := req.GetVolumeCapability()
	if msg := unsupported(c); msg != "" {
		return "", "", status.Error(codes.InvalidArgument, msg)
	}
	if msg := checkMountFlags(c.GetMount().GetMountFlags()); msg != "" {
		return "", "", status.Error(codes.InvalidArgument, msg)
	}
	block := c.GetBlock() != nil
	if !block && req.GetStagingTargetPath() == "" {
		return "", "", status.Error(codes.InvalidArgument, "staging target path is required for a mount volume: the driver stages it (STAGE_UNSTAGE_VOLUME)")
	}
	if target, err = d.kubeletPath("target path", req.GetTargetPath()); err != nil {
		return "", "", err
	}
	if !block {
		if staging, err = d.kubeletPath("staging target path", req.GetStagingTargetPath()); err != nil {
			return "", "", err
		}
	}
	if isInvalidName(req.GetVolumeId()) {
		return "", "", status.Errorf(codes.NotFound, "volume %s not found", req.GetVolumeId())
	}
	return staging, target, nil
}

// kubeletPath is underRoot for a path of a request, which must lie inside the kubelet root
// or one of the extra roots.
func (d *Driver) kubeletPath(what, p string) (string, error) {
	return d.requestPath(what, p, true)
}

// requestPath resolves p inside the first of the driver's roots that holds it (see
// Options.ExtraRoots); follow false leaves a last element that is a symbolic link unfollowed.
func (d *Driver) requestPath(what, p string, follow bool) (string, error) {
	var first error
	for _, root := range d.roots() {
		r, err := contained(root, p, follow)
		if err == nil {
			return r, nil
		}
		if first == nil {
			first = err
		}
	}
	return "", status.Errorf(codes.InvalidArgument, "%s %q must lie inside %s: %v", what, p, d.rootsFlag(), first)
}

// roots are the directories requests' paths may lie in: the kubelet root, then the extras.
func (d *Driver) roots() []string {
	return append([]string{d.o.KubeletRoot}, d.o.ExtraRoots...)
}

// rootsFlag names the roots for an error message, with the flags that set them.
func (d *Driver) rootsFlag() string {
	s := fmt.Sprintf("the kubelet root %s (--kubelet-root)", d.o.KubeletRoot)
	if len(d.o.ExtraRoots) > 0 {
		s += fmt.Sprintf(" or %s (--extra-root)", strings.Join(d.o.ExtraRoots, ", "))
	}
	return s
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

// Mount flags of what the driver mounts into a pod: a volume's content is data, never a way
// to device nodes or set-user-ID programs on the node. A published block volume is itself a
// device node, so it is nosuid only: nodev would make it unopenable.
const (
	mountFlags = unix.MS_NODEV | unix.MS_NOSUID
	blockFlags = unix.MS_NOSUID
)

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
	// Made now, so resolved now: a link swapped in on the way must not lead out.
	if target, err = d.kubeletPath("target path", target); err != nil {
		return err
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
	flags := uintptr(mountFlags)
	if readonly {
		flags |= unix.MS_RDONLY
	}
	if err := h.bind(staging, target, flags); err != nil {
		return status.Errorf(codes.Internal, "publishing volume %s: %v", id, err)
	}
	return nil
}

// publishBlock bind-mounts the loop device dev onto the target file, which it creates.
// Publishing twice is a no-op.
func (d *Driver) publishBlock(id, dev, target string, readonly bool) error {
	h := d.node()
	if _, ok, err := mountAt(target); err != nil {
		return status.Error(codes.Internal, err.Error())
	} else if ok {
		if !sameFile(target, dev) {
			return status.Errorf(codes.AlreadyExists, "target %s is already a mount point of something other than volume %s", target, id)
		}
		return nil
	}
	// O_NOFOLLOW: the target is made here, never reached through a link.
	f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY|unix.O_NOFOLLOW, 0o600)
	if err != nil && !errors.Is(err, unix.EISDIR) {
		return status.Errorf(codes.Internal, "creating target %s: %v", target, err)
	}
	if f != nil {
		_ = f.Close()
	}
	if target, err = d.kubeletPath("target path", target); err != nil {
		return err
	}
	flags := uintptr(blockFlags)
	if readonly {
		flags |= unix.MS_RDONLY
	}
	if err := h.bind(dev, target, flags); err != nil {
		return status.Errorf(codes.Internal, "publishing volume %s: %v", id, err)
	}
	return nil
}

// bind bind-mounts src onto dst with the per-mount flags (MS_NODEV, MS_NOSUID, MS_RDONLY),
// which a bind mount takes only from a remount; a failed remount leaves nothing mounted.
func (h *host) bind(src, dst string, flags uintptr) error {
	if err := h.mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s on %s: %w", src, dst, err)
	}
	if err := h.mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|flags, ""); err != nil {
		if uerr := h.unmount(dst, 0); uerr != nil {
			return fmt.Errorf("remounting %s with its flags: %w (and unmounting it again: %v)", dst, err, uerr)
		}
		return fmt.Errorf("remounting %s with its flags: %w", dst, err)
	}
	return nil
}

// NodeUnpublishVolume implements csi.NodeServer: it undoes NodePublishVolume; a target that
// is already gone is success. Only what the driver published for this volume is unmounted:
// a mount of anything else at the target is refused and left, target and all.
func (d *Driver) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume id is required")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "target path is required")
	}
	// Not followed if it is a link: a link is removed, never gone through.
	target, err := d.requestPath("target path", req.GetTargetPath(), false)
	if err != nil {
		return nil, err
	}
	id := req.GetVolumeId()
	done, err := d.lockVolume(id)
	if err != nil {
		return nil, err
	}
	defer done()
	h := d.node()
	for i := 0; ; i++ {
		m, mounted, err := mountAt(target)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if !mounted {
			break
		}
		if i == maxUnmounts {
			return nil, status.Errorf(codes.Internal, "%s is still a mount point after %d unmounts", target, i)
		}
		if !d.published(id, m, target) {
			return nil, status.Errorf(codes.FailedPrecondition, "target %s is a mount point of %s, which is not volume %s as crdipc publishes it: not unmounting it", target, m.source, id)
		}
		if err := h.unmount(target, 0); errors.Is(err, unix.EINVAL) {
			break // not a mount point after all
		} else if err != nil {
			return nil, status.Errorf(codes.Internal, "unmounting %s: %v", target, err)
		}
	}
	// Once the target is unmounted, a LinkName inside it is ours, not the volume's: an earlier
	// version linked the volume there. A mount there is not.
	link := filepath.Join(target, LinkName)
	if isMountPoint(link) {
		return nil, status.Errorf(codes.FailedPrecondition, "%s is a mount point, which crdipc does not publish: not unmounting it", link)
	}
	if fi, err := os.Lstat(link); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		if err := os.Remove(link); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, status.Errorf(codes.Internal, "removing %s: %v", link, err)
		}
	}
	// The spec has the plugin remove the target path it published to: the block target
	// file, or the (now empty) mount directory.
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "removing %s: %v", target, err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// published reports whether mount m at target is volume id as NodePublishVolume mounts it:
// the whole file system on the volume's loop device (mount access), or the loop device node
// itself (block access).
func (d *Driver) published(id string, m mountEntry, target string) bool {
	if m.root == "/" && d.ours(id, m.source) {
		return true
	}
	return d.ours(id, loopDeviceOf(target))
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

// awaitVolumeLock is lockVolume for work that may wait its turn: it tries again until ctx
// ends.
func (d *Driver) awaitVolumeLock(ctx context.Context, id string) (func(), error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		unlock, err := d.lockVolume(id)
		if err == nil {
			return unlock, nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return nil, status.Errorf(status.FromContextError(ctx.Err()).Code(), "waiting for the operation in progress on volume %s: %v", id, ctx.Err())
		}
	}
}

// awaitNodeOps waits, at most timeout, for the node operations in flight. A gRPC server
// that stops cancels their calls but not their work: an unstage cut short by the process
// exiting would leave its volume's mounts on a FUSE file nobody serves.
func (d *Driver) awaitNodeOps(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for {
		d.nodeOps.Lock()
		busy := len(d.nodeOps.busy)
		d.nodeOps.Unlock()
		if busy == 0 {
			return
		}
		if time.Now().After(deadline) {
			d.log.Info("stopping with node operations still in flight", "volumes", busy)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
