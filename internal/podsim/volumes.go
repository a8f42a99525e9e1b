package podsim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The volume manager's timing, after kubelet's: a claim that is not bound yet is looked at
// again every pvcPoll; a failed mount or unmount is retried with exponential back-off.
const (
	volumeTimeout   = 2 * time.Minute // bounds one setup or teardown of a pod's volumes
	pvcPoll         = time.Second
	mountBackoff    = 500 * time.Millisecond
	maxMountBackoff = 2 * time.Minute
)

// volPath is a volume of a pod as set up on the node.
type volPath struct {
	path     string
	readOnly bool
	csi      bool // a CSI volume: the container cannot run without its mount
}

// csiVolume is a CSI volume the runtime staged or published for one pod.
type csiVolume struct {
	name      string // the pod's volume name
	claim     string // its PersistentVolumeClaim
	pv        string
	handle    string
	node      string
	staging   string // "" when the driver does not stage
	target    string
	published bool // NodePublishVolume was called, successfully or not
}

// podVolumes is the volume state of one pod, under runtime.mu.
type podVolumes struct {
	needed    bool // the pod has volumes the runtime sets up
	ready     bool // they are set up: containers may start
	busy      bool // a setup or teardown goroutine runs for the pod
	paths     map[string]volPath
	csi       []*csiVolume
	wait      *corev1.ContainerStateWaiting // why the containers wait for their volumes
	notBefore time.Time                     // next setup or teardown attempt
	backoff   time.Duration
	event     string // the last FailedMount message, not repeated on every retry
}

// waitError is a volume that cannot be set up yet for a reason that is not a failure: a
// claim that is not bound yet.
type waitError struct{ msg string }

func (e *waitError) Error() string { return e.msg }

// needsVolumes says whether the pod has volumes the runtime sets up: PersistentVolumeClaims
// and emptyDirs. Other volume types (ConfigMap, Secret, projected, hostPath, …) are ignored.
func needsVolumes(pod *corev1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil || v.EmptyDir != nil {
			return true
		}
	}
	return false
}

// awaitVolumes, under mu, starts setting up the pod's volumes when due and has its
// containers wait; it returns when to look again (zero: the setup will enqueue the pod).
func (r *runtime) awaitVolumes(ps *podState, pod *corev1.Pod, t time.Time) time.Time {
	v := &ps.vols
	if !v.busy && !t.Before(v.notBefore) {
		v.busy = true
		r.wg.Add(1)
		go r.mountVolumes(ps, pod.DeepCopy())
	}
	for _, c := range ps.all() {
		if !c.running() && c.term == nil {
			c.wait = v.wait // nil: ContainerCreating without a message, as while mounting
		}
	}
	if v.busy {
		return time.Time{}
	}
	return v.notBefore
}

// mountVolumes sets up a pod's volumes, records the outcome and enqueues the pod.
func (r *runtime) mountVolumes(ps *podState, pod *corev1.Pod) {
	defer r.wg.Done()
	r.volOps.Lock()
	ctx, cancel := context.WithTimeout(r.volCtx, volumeTimeout)
	paths, err := r.setUpVolumes(ctx, ps, pod)
	cancel()
	r.volOps.Unlock()

	var event string
	var claims []string
	r.mu.Lock()
	v := &ps.vols
	v.busy = false
	var we *waitError
	switch {
	case err == nil:
		v.ready, v.paths, v.wait, v.backoff, v.notBefore, v.event = true, paths, nil, 0, time.Time{}, ""
		for _, c := range ps.all() {
			if c.wait != nil && c.wait.Reason == reasonCreating {
				c.wait = nil
			}
		}
		for _, cv := range v.csi {
			claims = append(claims, cv.claim)
		}
	case errors.As(err, &we):
		v.backoff, v.notBefore = 0, time.Now().Add(pvcPoll)
		v.wait = &corev1.ContainerStateWaiting{Reason: reasonCreating, Message: err.Error()}
	default:
		v.backoff = min(max(2*v.backoff, mountBackoff), maxMountBackoff)
		v.notBefore = time.Now().Add(v.backoff)
		v.wait = &corev1.ContainerStateWaiting{Reason: reasonCreating, Message: err.Error()}
		if v.event != err.Error() {
			v.event, event = err.Error(), err.Error()
		}
	}
	r.mu.Unlock()
	if event != "" {
		r.events(pod).Eventf(pod, nil, corev1.EventTypeWarning, "FailedMount", "MountVolume", "%s", event)
	}
	// A claim grown while no pod mounted it is expanded on the node now.
	r.expandLater(pod.Namespace, claims)
	r.enqueue(ps.key)
}

// setUpVolumes makes the pod's volumes: an emptyDir is a directory of the pod's; a claim of
// a CSI PersistentVolume is staged on the node and published into the pod's directory.
// The caller holds volOps.
func (r *runtime) setUpVolumes(ctx context.Context, ps *podState, pod *corev1.Pod) (map[string]volPath, error) {
	paths := map[string]volPath{}
	for i := range pod.Spec.Volumes {
		vol := &pod.Spec.Volumes[i]
		switch {
		case vol.EmptyDir != nil:
			dir := filepath.Join(ps.dir, "volumes", "kubernetes.io~empty-dir", vol.Name)
			if err := os.MkdirAll(dir, 0o750); err != nil {
				return nil, fmt.Errorf("MountVolume.SetUp failed for volume %q: %w", vol.Name, err)
			}
			// Anyone in the pod may write to an emptyDir, as kubelet makes it.
			if err := os.Chmod(dir, 0o777); err != nil {
				return nil, fmt.Errorf("MountVolume.SetUp failed for volume %q: %w", vol.Name, err)
			}
			paths[vol.Name] = volPath{path: dir}
		case vol.PersistentVolumeClaim != nil:
			p, err := r.mountClaim(ctx, ps, pod, vol)
			if err != nil {
				return nil, err
			}
			paths[vol.Name] = p
		}
	}
	return paths, nil
}

// mountClaim stages and publishes the PersistentVolume bound to a claim of the pod.
func (r *runtime) mountClaim(ctx context.Context, ps *podState, pod *corev1.Pod, vol *corev1.Volume) (volPath, error) {
	name := vol.PersistentVolumeClaim.ClaimName
	// As the node: it may get the claims of its pods and their volumes.
	kc, err := r.as(pod.Spec.NodeName)
	if err != nil {
		return volPath{}, err
	}
	var pvc corev1.PersistentVolumeClaim
	err = kc.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: name}, &pvc)
	switch {
	case apierrors.IsNotFound(err):
		return volPath{}, &waitError{fmt.Sprintf("waiting for PersistentVolumeClaim %q: persistentvolumeclaim %q not found", name, name)}
	case err != nil:
		return volPath{}, fmt.Errorf("reading PersistentVolumeClaim %q: %w", name, err)
	case pvc.DeletionTimestamp != nil:
		return volPath{}, &waitError{fmt.Sprintf("PersistentVolumeClaim %q is being deleted", name)}
	case pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "":
		return volPath{}, &waitError{fmt.Sprintf("waiting for PersistentVolumeClaim %q to be bound", name)}
	}
	var pv corev1.PersistentVolume
	err = kc.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv)
	switch {
	case apierrors.IsNotFound(err):
		return volPath{}, &waitError{fmt.Sprintf("waiting for PersistentVolume %q of claim %q", pvc.Spec.VolumeName, name)}
	case err != nil:
		return volPath{}, fmt.Errorf("reading PersistentVolume %q: %w", pvc.Spec.VolumeName, err)
	case pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != pvc.UID:
		return volPath{}, &waitError{fmt.Sprintf("waiting for PersistentVolume %q to be bound to claim %q", pv.Name, name)}
	}
	src := pv.Spec.CSI
	switch {
	case src == nil || src.Driver != r.o.CSIDriver || r.o.CSI == nil:
		return volPath{}, fmt.Errorf("MountVolume.SetUp failed for volume %q (%s): the simulated nodes mount only CSI volumes of %s", vol.Name, pv.Name, r.driverName())
	case pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == corev1.PersistentVolumeBlock:
		return volPath{}, fmt.Errorf("MountVolume.SetUp failed for volume %q (%s): the simulated nodes do not run block volumes (volumeDevices)", vol.Name, pv.Name)
	}
	node := pod.Spec.NodeName
	nc, err := r.o.CSI(node)
	if err != nil {
		return volPath{}, fmt.Errorf("MountVolume.SetUp failed for volume %q (%s): %w", vol.Name, pv.Name, err)
	}
	capability := volumeCapability(&pv)
	readOnly := vol.PersistentVolumeClaim.ReadOnly || src.ReadOnly

	r.mu.Lock()
	var cv *csiVolume
	for _, v := range ps.vols.csi {
		if v.name == vol.Name {
			cv = v
		}
	}
	fresh := cv == nil
	if fresh {
		cv = &csiVolume{name: vol.Name, claim: name, pv: pv.Name, handle: src.VolumeHandle, node: node,
			target: filepath.Join(ps.dir, "volumes", "kubernetes.io~csi", pv.Name, "mount")}
		ps.vols.csi = append(ps.vols.csi, cv)
	}
	r.mu.Unlock()

	caps, err := nc.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		return volPath{}, fmt.Errorf("MountVolume.MountDevice failed for volume %q (%s): NodeGetCapabilities: %w", vol.Name, pv.Name, err)
	}
	if stages(caps) {
		// One staging path per node and volume, shared by the node's pods, where kubelet
		// puts it: plugins/kubernetes.io/csi/<driver>/<sha256(volume handle)>/globalmount.
		sum := sha256.Sum256([]byte(src.VolumeHandle))
		staging := filepath.Join(r.o.Root, "nodes", node, "plugins", "kubernetes.io", "csi", src.Driver, hex.EncodeToString(sum[:]), "globalmount")
		if err := os.MkdirAll(staging, 0o750); err != nil {
			return volPath{}, fmt.Errorf("MountVolume.MountDevice failed for volume %q (%s): %w", vol.Name, pv.Name, err)
		}
		r.mu.Lock()
		cv.staging = staging
		r.mu.Unlock()
		_, err := nc.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
			VolumeId: src.VolumeHandle, StagingTargetPath: staging, VolumeCapability: capability, VolumeContext: src.VolumeAttributes,
		})
		if err != nil {
			return volPath{}, fmt.Errorf("MountVolume.MountDevice failed for volume %q (%s): %w", vol.Name, pv.Name, err)
		}
	}
	// A mount left at the target by an up that died is on a device that is gone: it goes
	// before this runtime publishes there for the first time.
	if fresh && isMountPoint(cv.target) {
		if _, err := nc.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: src.VolumeHandle, TargetPath: cv.target}); err != nil {
			return volPath{}, fmt.Errorf("MountVolume.SetUp failed for volume %q (%s): removing a stale mount: %w", vol.Name, pv.Name, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(cv.target), 0o750); err != nil {
		return volPath{}, fmt.Errorf("MountVolume.SetUp failed for volume %q (%s): %w", vol.Name, pv.Name, err)
	}
	r.mu.Lock()
	cv.published = true
	r.mu.Unlock()
	_, err = nc.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: src.VolumeHandle, StagingTargetPath: cv.staging, TargetPath: cv.target,
		VolumeCapability: capability, Readonly: readOnly, VolumeContext: src.VolumeAttributes,
	})
	if err != nil {
		return volPath{}, fmt.Errorf("MountVolume.SetUp failed for volume %q (%s): %w", vol.Name, pv.Name, err)
	}
	return volPath{path: cv.target, readOnly: readOnly, csi: true}, nil
}

func (r *runtime) driverName() string {
	if r.o.CSI == nil || r.o.CSIDriver == "" {
		return "no CSI driver (none is configured)"
	}
	return "the CSI driver " + r.o.CSIDriver
}

func stages(caps *csi.NodeGetCapabilitiesResponse) bool {
	for _, c := range caps.GetCapabilities() {
		if c.GetRpc().GetType() == csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME {
			return true
		}
	}
	return false
}

// volumeCapability is the capability kubelet asks for a PersistentVolume: a mount volume
// with the PV's file system type and mount options, in the access mode of its first
// access mode.
func volumeCapability(pv *corev1.PersistentVolume) *csi.VolumeCapability {
	mode := csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	if len(pv.Spec.AccessModes) > 0 {
		switch pv.Spec.AccessModes[0] {
		case corev1.ReadOnlyMany:
			mode = csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
		case corev1.ReadWriteMany:
			mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
		case corev1.ReadWriteOncePod:
			mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		}
	}
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: pv.Spec.CSI.FSType, MountFlags: pv.Spec.MountOptions}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

// needsTeardown, under mu: the pod holds CSI volumes or mount point directories.
func (r *runtime) needsTeardown(ps *podState) bool {
	return len(ps.vols.csi) > 0 || r.holdsHostDirs(ps.uid)
}

// unmountLater, under mu, tears a finished pod's volumes down in the background once its
// processes are gone; the pod is enqueued when that is done (or failed, to retry).
func (r *runtime) unmountLater(ps *podState, pod *corev1.Pod) {
	if ps.vols.busy || r.stopping || time.Now().Before(ps.vols.notBefore) {
		return
	}
	ps.vols.busy = true
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.volOps.Lock()
		ctx, cancel := context.WithTimeout(r.volCtx, volumeTimeout)
		err := r.unmountVolumes(ctx, ps)
		cancel()
		r.volOps.Unlock()
		r.mu.Lock()
		v := &ps.vols
		v.busy = false
		if err != nil {
			v.backoff = min(max(2*v.backoff, mountBackoff), maxMountBackoff)
			v.notBefore = time.Now().Add(v.backoff)
		} else {
			v.backoff, v.notBefore = 0, time.Time{}
			r.releaseHostDirs(ps.uid)
		}
		r.mu.Unlock()
		if err != nil {
			r.log.Error(err, "unmounting volumes", "pod", ps.key)
			r.events(pod).Eventf(pod, nil, corev1.EventTypeWarning, "FailedUnmount", "UnmountVolume", "%s", err.Error())
		}
		r.enqueue(ps.key)
	}()
}

// unmountVolumes unpublishes the pod's CSI volumes and unstages each that no other pod on
// its node uses. The caller holds volOps; the pod's processes are gone.
func (r *runtime) unmountVolumes(ctx context.Context, ps *podState) error {
	r.mu.Lock()
	vols := append([]*csiVolume(nil), ps.vols.csi...)
	ps.vols.ready = false
	r.mu.Unlock()
	var errs []error
	for _, cv := range vols {
		if err := r.unmountVolume(ctx, ps, cv); err != nil {
			errs = append(errs, err)
			continue
		}
		r.mu.Lock()
		for i, v := range ps.vols.csi {
			if v == cv {
				ps.vols.csi = append(ps.vols.csi[:i], ps.vols.csi[i+1:]...)
				break
			}
		}
		r.mu.Unlock()
	}
	return errors.Join(errs...)
}

func (r *runtime) unmountVolume(ctx context.Context, ps *podState, cv *csiVolume) error {
	if r.o.CSI == nil {
		return nil
	}
	nc, err := r.o.CSI(cv.node)
	if err != nil {
		return fmt.Errorf("UnmountVolume.TearDown failed for volume %q (%s): %w", cv.name, cv.pv, err)
	}
	r.mu.Lock()
	published := cv.published
	r.mu.Unlock()
	if published {
		if err := whenFree(ctx, func() error {
			_, err := nc.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: cv.handle, TargetPath: cv.target})
			return err
		}); err != nil {
			return fmt.Errorf("UnmountVolume.TearDown failed for volume %q (%s): %w", cv.name, cv.pv, err)
		}
		r.mu.Lock()
		cv.published = false
		r.mu.Unlock()
	}
	if cv.staging == "" || r.stagedForOthers(ps, cv) {
		return nil
	}
	if err := whenFree(ctx, func() error {
		_, err := nc.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: cv.handle, StagingTargetPath: cv.staging})
		return err
	}); err != nil {
		return fmt.Errorf("UnmountDevice failed for volume %q (%s): %w", cv.name, cv.pv, err)
	}
	r.mu.Lock()
	delete(r.expandInUse, cv.node+"/"+cv.handle) // a pending expansion is tried at the next stage
	r.mu.Unlock()
	// The staging directory is the CO's: it goes with the volume's directory above it.
	_ = os.Remove(cv.staging)
	_ = os.Remove(filepath.Dir(cv.staging))
	return nil
}

// stagedForOthers says whether another pod on cv's node holds the same volume, which
// keeps it staged.
func (r *runtime) stagedForOthers(ps *podState, cv *csiVolume) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, other := range r.pods {
		if other == ps {
			continue
		}
		for _, v := range other.vols.csi {
			if v.node == cv.node && v.handle == cv.handle {
				return true
			}
		}
	}
	return false
}

// containerMounts are the bind mounts of container c: each of its volumeMounts whose volume
// the runtime set up, at its mountPath, with subPath and readOnly.
func containerMounts(c *corev1.Container, vols map[string]volPath, env map[string]string) ([]bindMount, error) {
	var mounts []bindMount
	for _, vm := range c.VolumeMounts {
		vp, ok := vols[vm.Name]
		if !ok {
			continue // a volume type the runtime does not set up: ignored, as always
		}
		if !filepath.IsAbs(vm.MountPath) {
			return nil, fmt.Errorf("volume mount %s: mountPath %q is not absolute", vm.Name, vm.MountPath)
		}
		src := vp.path
		sub := vm.SubPath
		if vm.SubPathExpr != "" {
			sub = expandString(vm.SubPathExpr, env)
		}
		if sub != "" {
			if filepath.IsAbs(sub) || sub == ".." || strings.HasPrefix(filepath.Clean(sub), "../") {
				return nil, fmt.Errorf("volume mount %s: subPath %q must be a relative path within the volume", vm.Name, sub)
			}
			p := filepath.Join(src, sub)
			// As kubelet: a missing subPath is created as a directory.
			if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
				if err := os.MkdirAll(p, 0o750); err != nil {
					return nil, fmt.Errorf("volume mount %s: creating subPath %q: %w", vm.Name, sub, err)
				}
			}
			// A symbolic link in the volume must not lead out of it.
			real, err := filepath.EvalSymlinks(p)
			if err != nil {
				return nil, fmt.Errorf("volume mount %s: subPath %q: %w", vm.Name, sub, err)
			}
			if rel, err := filepath.Rel(src, real); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
				return nil, fmt.Errorf("volume mount %s: subPath %q leads out of the volume", vm.Name, sub)
			}
			src = real
		}
		mounts = append(mounts, bindMount{src: src, dst: filepath.Clean(vm.MountPath), readOnly: vm.ReadOnly || vp.readOnly, csi: vp.csi})
	}
	// Parents before children: /data before /data/cache.
	sort.SliceStable(mounts, func(i, j int) bool { return len(mounts[i].dst) < len(mounts[j].dst) })
	return mounts, nil
}

// bindMount is one volume mount of a container: src on the node at dst in its namespace.
type bindMount struct {
	src, dst string
	readOnly bool
	csi      bool
}

// Mount point directories. A mountPath that does not exist on the node, such as /data, is
// created there (directories are not namespaced) and removed, if empty, once no pod's
// container that mounts something there runs any more. hostDirs holds the directories the
// runtime created, each with the pods that use it; under mu.

// useHostDirs, under mu, records that pod uid mounts at dsts, of which created were made now.
func (r *runtime) useHostDirs(uid types.UID, created, dsts []string) {
	if r.hostDirs == nil {
		r.hostDirs = map[string]map[types.UID]bool{}
	}
	for _, d := range created {
		if r.hostDirs[d] == nil {
			r.hostDirs[d] = map[types.UID]bool{}
		}
	}
	for d, users := range r.hostDirs {
		for _, dst := range dsts {
			if dst == d || strings.HasPrefix(dst, d+"/") {
				users[uid] = true
			}
		}
	}
}

func (r *runtime) holdsHostDirs(uid types.UID) bool {
	for _, users := range r.hostDirs {
		if users[uid] {
			return true
		}
	}
	return false
}

// releaseHostDirs, under mu, drops pod uid from the mount point directories and removes
// those no pod uses any more, deepest first and only when empty.
func (r *runtime) releaseHostDirs(uid types.UID) {
	var unused []string
	for d, users := range r.hostDirs {
		delete(users, uid)
		if len(users) == 0 {
			unused = append(unused, d)
		}
	}
	sort.Slice(unused, func(i, j int) bool { return len(unused[i]) > len(unused[j]) })
	for _, d := range unused {
		delete(r.hostDirs, d)
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			r.log.Info("leaving a mount point directory that is not empty", "dir", d, "error", err.Error())
		}
	}
}

// removePodDir removes a pod's directory. Whatever is still mounted below it (a volume
// whose unpublishing failed, or one left by an up that died) is detached first: removing
// the directory must never remove a volume's content.
func (r *runtime) removePodDir(dir string) {
	for _, m := range mountsUnder(dir) {
		if err := unmountDetach(m); err != nil {
			r.log.Error(err, "unmounting before removing pod directory; leaving the directory", "mount", m)
			return
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		r.log.Error(err, "removing pod directory", "dir", dir)
	}
}

// whenFree calls op until it is not Aborted: the driver refuses a call on a volume while
// another is in flight (a snapshot being taken, or a teardown whose caller gave up but whose
// work goes on), and kubelet retries those. Backing off from 20 ms to 1 s, until ctx ends.
func whenFree(ctx context.Context, op func() error) error {
	wait := 20 * time.Millisecond
	for {
		err := op()
		if status.Code(err) != codes.Aborted {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}
