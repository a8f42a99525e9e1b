package podsim

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/crdipc/crdipc/internal/csi/claimresize"
)

// Volume expansion, the node half, as kubelet's volume manager does it for a mounted
// volume (online expansion): once the controller side is done — the claim's
// allocatedResourceStatuses["storage"] is NodeResizePending, as the CSI sidecar's resizer
// leaves it, and the PV's capacity exceeds the claim's status.capacity — the node that
// mounts the volume gets NodeExpandVolume, with the pod's publish path as volume_path and
// the staging path, as kubelet passes them. On success the claim's status.capacity becomes
// the PV's capacity and the resize status and conditions go; a failure is the condition
// NodeResizeError (and NodeResizeInfeasible for a final code) and a FileSystemResizeFailed
// Event on the pod. A claim that no pod mounts is expanded when one mounts it.

// Event reasons of the node expansion, as kubelet records them on the pod.
const (
	eventFSResizeSuccessful = "FileSystemResizeSuccessful"
	eventFSResizeFailed     = "FileSystemResizeFailed"
)

// addExpander adds the controller that expands mounted claims; pods whose volumes become
// ready enqueue their claims too (expandLater). A PV's change enqueues its claim: the
// resizer grows the PV and then marks the claim NodeResizePending, and the two arrive
// through different informers, so the claim's event can be handled while the PV in the
// cache is still the smaller one; the PV's event then looks at the claim again.
func addExpander(mgr manager.Manager, r *runtime) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("podsim-volume-expander").
		For(&corev1.PersistentVolumeClaim{}).
		Watches(&corev1.PersistentVolume{}, handler.EnqueueRequestsFromMapFunc(claimOfVolume)).
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			r.mu.Lock()
			r.claimQueue = q
			r.mu.Unlock()
			return nil
		})).
		WithOptions(controller.Options{
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](mountBackoff, maxMountBackoff),
		}).
		Complete(reconcile.Func(r.reconcileExpansion))
}

// claimOfVolume is the claim a PV is bound to.
func claimOfVolume(_ context.Context, o client.Object) []reconcile.Request {
	pv, ok := o.(*corev1.PersistentVolume)
	if !ok || pv.Spec.ClaimRef == nil {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: pv.Spec.ClaimRef.Namespace, Name: pv.Spec.ClaimRef.Name}}}
}

// expandLater asks for the claims of a pod whose volumes were just set up to be looked at:
// one whose expansion waits for a node is expanded now that a node mounts it.
func (r *runtime) expandLater(ns string, claims []string) {
	r.mu.Lock()
	q := r.claimQueue
	r.mu.Unlock()
	if q == nil {
		return
	}
	for _, c := range claims {
		q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: c}})
	}
}

// mountedClaim is where a claim's volume is published for a pod.
type mountedClaim struct {
	pod                         types.NamespacedName
	podUID                      types.UID
	volume, node, staging, path string
}

func (r *runtime) reconcileExpansion(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	if r.o.CSI == nil {
		return reconcile.Result{}, nil
	}
	var pvc corev1.PersistentVolumeClaim
	if err := r.c.Get(ctx, req.NamespacedName, &pvc); err != nil || pvc.Spec.VolumeName == "" {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	var pv corev1.PersistentVolume
	if err := r.c.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != r.o.CSIDriver || !nodeExpansionPending(&pvc, &pv) {
		return reconcile.Result{}, nil
	}
	// Held so that no teardown unpublishes the volume while it grows; with it held, a
	// pod whose volumes are ready has them mounted.
	r.volOps.Lock()
	defer r.volOps.Unlock()
	m, ok := r.mountOf(pvc.Namespace, pvc.Name, pv.Spec.CSI.VolumeHandle)
	if !ok {
		return reconcile.Result{}, nil // expanded when a pod mounts it
	}
	r.mu.Lock()
	inUse := r.expandInUse[m.node+"/"+pv.Spec.CSI.VolumeHandle]
	r.mu.Unlock()
	if inUse {
		return reconcile.Result{}, nil // expanded when it is staged again
	}
	return reconcile.Result{}, r.expandVolume(ctx, &pvc, &pv, m)
}

// nodeExpansionPending says whether the controller has grown pv for pvc and the node's
// part is due: allocatedResourceStatuses says so (or, from a resizer that does not set it,
// the condition FileSystemResizePending), and the claim's capacity is still below the PV's.
func nodeExpansionPending(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) bool {
	pvSize := pv.Spec.Capacity[corev1.ResourceStorage]
	if have := pvc.Status.Capacity[corev1.ResourceStorage]; have.Cmp(pvSize) >= 0 {
		return false
	}
	switch pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] {
	case corev1.PersistentVolumeClaimNodeResizePending, corev1.PersistentVolumeClaimNodeResizeInProgress:
		return true
	case "":
		for _, c := range pvc.Status.Conditions {
			if c.Type == corev1.PersistentVolumeClaimFileSystemResizePending && c.Status == corev1.ConditionTrue {
				return true
			}
		}
	}
	return false
}

// mountOf finds a pod of this runtime whose volumes are set up and that has claim's volume
// (handle) published. The caller holds volOps.
func (r *runtime) mountOf(ns, claim, handle string) (mountedClaim, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ps := range r.pods {
		if ps.key.Namespace != ns || !ps.vols.ready {
			continue
		}
		for _, cv := range ps.vols.csi {
			if cv.claim == claim && cv.handle == handle && cv.published {
				return mountedClaim{pod: ps.key, podUID: ps.uid, volume: cv.name, node: cv.node, staging: cv.staging, path: cv.target}, true
			}
		}
	}
	return mountedClaim{}, false
}

// expandVolume runs NodeExpandVolume for the claim where m has it mounted and records the
// outcome on the claim and the pod.
func (r *runtime) expandVolume(ctx context.Context, pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume, m mountedClaim) error {
	size := pv.Spec.Capacity[corev1.ResourceStorage]
	// The node names whose kubelet records the pod's Events.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: m.pod.Namespace, Name: m.pod.Name, UID: m.podUID}, Spec: corev1.PodSpec{NodeName: m.node}}
	if err := r.patchClaimStatus(ctx, m.node, pvc, func(s *corev1.PersistentVolumeClaimStatus) {
		claimresize.SetStatus(s, corev1.PersistentVolumeClaimNodeResizeInProgress)
	}); err != nil {
		return err
	}
	nc, err := r.o.CSI(m.node)
	if err == nil {
		cctx, cancel := context.WithTimeout(ctx, volumeTimeout)
		_, err = nc.NodeExpandVolume(cctx, &csi.NodeExpandVolumeRequest{
			VolumeId: pv.Spec.CSI.VolumeHandle, VolumePath: m.path, StagingTargetPath: m.staging,
			CapacityRange: &csi.CapacityRange{RequiredBytes: size.Value()}, VolumeCapability: volumeCapability(pv),
		})
		cancel()
	}
	if err != nil {
		msg := fmt.Sprintf("MountVolume.NodeExpandVolume failed for volume %q (%s) on %s: %v", m.volume, pv.Name, m.node, err)
		r.events(pod).Eventf(pod, nil, corev1.EventTypeWarning, eventFSResizeFailed, "NodeExpandVolume", "%s", msg)
		final, inUse := false, false
		switch status.Code(err) {
		case codes.InvalidArgument, codes.OutOfRange, codes.NotFound:
			final = true
		case codes.FailedPrecondition:
			// The CSI spec's "cannot grow while staged or published": kubelet leaves the
			// claim pending and tries again once the volume is staged anew on the node.
			inUse = true
			msg += "; tried again when the volume is next staged on the node"
			r.mu.Lock()
			if r.expandInUse == nil {
				r.expandInUse = map[string]bool{}
			}
			r.expandInUse[m.node+"/"+pv.Spec.CSI.VolumeHandle] = true
			r.mu.Unlock()
		}
		if perr := r.patchClaimStatus(ctx, m.node, pvc, func(s *corev1.PersistentVolumeClaimStatus) {
			s.Conditions = claimresize.MergeConditions(s.Conditions, corev1.PersistentVolumeClaimCondition{
				Type: corev1.PersistentVolumeClaimNodeResizeError, Status: corev1.ConditionTrue, Message: msg,
			})
			if final {
				claimresize.SetStatus(s, corev1.PersistentVolumeClaimNodeResizeInfeasible)
			} else {
				claimresize.SetStatus(s, corev1.PersistentVolumeClaimNodeResizePending)
			}
		}); perr != nil {
			return perr
		}
		if final || inUse {
			return nil // as kubelet: not retried until the claim's expansion is started again, or the volume staged again
		}
		return fmt.Errorf("%s", msg)
	}
	if err := r.patchClaimStatus(ctx, m.node, pvc, func(s *corev1.PersistentVolumeClaimStatus) {
		if s.Capacity == nil {
			s.Capacity = corev1.ResourceList{}
		}
		s.Capacity[corev1.ResourceStorage] = size
		s.Conditions = claimresize.MergeConditions(s.Conditions)
		claimresize.SetStatus(s, "")
	}); err != nil {
		return err
	}
	r.events(pod).Eventf(pod, nil, corev1.EventTypeNormal, eventFSResizeSuccessful, "NodeExpandVolume",
		"MountVolume.NodeExpandVolume succeeded for volume %q (%s) on %s: %s", m.volume, pv.Name, m.node, size.String())
	return nil
}

// patchClaimStatus applies change to the claim's status, guarded by its resourceVersion: a
// claim the resizer changed meanwhile is read again and retried.
// It writes as node, which mounts the claim: the Node authorizer lets a node update the
// status of its pods' claims.
func (r *runtime) patchClaimStatus(ctx context.Context, node string, pvc *corev1.PersistentVolumeClaim, change func(*corev1.PersistentVolumeClaimStatus)) error {
	kc, err := r.as(node)
	if err != nil {
		return err
	}
	patch := client.MergeFromWithOptions(pvc.DeepCopy(), client.MergeFromWithOptimisticLock{})
	change(&pvc.Status)
	if err := kc.Status().Patch(ctx, pvc, patch); err != nil {
		return fmt.Errorf("updating the status of PersistentVolumeClaim %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	return nil
}
