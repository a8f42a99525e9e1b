package sidecar

import (
	"context"
	"fmt"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/lru"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/csi/claimresize"
)

// Event reasons and the PVC condition message of the resizer, as upstream's external-resizer
// records them (so what `kubectl describe pvc` shows reads the same).
const (
	EventResizing                 = "Resizing"
	EventVolumeResizeFailed       = "VolumeResizeFailed"
	EventVolumeResizeSuccessful   = "VolumeResizeSuccessful"
	EventFileSystemResizeRequired = "FileSystemResizeRequired"
	fsResizePendingMessage        = "Waiting for user to (re-)start a pod to finish file system resize of volume on node."
)

// resizer does what upstream's external-resizer does (with RecoverVolumeExpansionFailure,
// GA in Kubernetes): a bound claim of the driver whose storage request exceeds its
// status.capacity gets ControllerExpandVolume; the PV's capacity becomes the new size; the
// claim's status records each step in allocatedResources and allocatedResourceStatuses
// ("storage": ControllerResizeInProgress, then NodeResizePending, which the kubelet takes
// from there) and in the conditions Resizing and FileSystemResizePending. Retryable
// failures are retried with backoff; a final one is recorded (ControllerResizeError, and
// ControllerResizeInfeasible for a size the driver refuses) and not retried until the claim
// asks for another size.
type resizer struct {
	*started
	c client.Client
	// fresh reads claims from the API server itself: a claim from the cache may predate the
	// resizer's own last write, and acting on it would repeat a call already answered.
	fresh client.Reader
	csi   csi.ControllerClient
	o     Options
	log   logr.Logger
	// failed holds the claims whose expansion failed for good, by UID, with the size
	// requested then. Not the resourceVersion: any other write to the claim (an annotation,
	// another controller's status) would have it asked again for what was refused.
	failed *lru.Cache
}

func (z *resizer) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("csi-resizer").
		For(&corev1.PersistentVolumeClaim{}).
		// A PV's capacity changing (as this resizer writes it) brings its claim back.
		Watches(&corev1.PersistentVolume{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			ref := o.(*corev1.PersistentVolume).Spec.ClaimRef
			if ref == nil {
				return nil
			}
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}}}
		})).
		WithOptions(controller.Options{
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](z.o.BackoffBase, z.o.BackoffMax),
		}).
		Complete(z)
}

// Reconcile implements reconcile.Reconciler.
func (z *resizer) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	driver, rec := z.state()
	if driver == "" {
		return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	var pvc corev1.PersistentVolumeClaim
	if err := z.fresh.Get(ctx, req.NamespacedName, &pvc); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	requested := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" || requested.Cmp(pvc.Status.Capacity[corev1.ResourceStorage]) <= 0 {
		return reconcile.Result{}, nil
	}
	var pv corev1.PersistentVolume
	if err := z.c.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != driver || pv.Spec.ClaimRef == nil ||
		pv.Spec.ClaimRef.Namespace != pvc.Namespace || pv.Spec.ClaimRef.UID != pvc.UID {
		return reconcile.Result{}, nil
	}
	if size, ok := z.failed.Get(pvc.UID); ok && size == requested.String() {
		z.log.V(1).Info("not retrying an expansion that failed for good until the claim asks for another size", "claim", req.NamespacedName)
		return reconcile.Result{}, nil
	}
	size, ok := expansionTarget(&pvc, &pv)
	if !ok {
		return reconcile.Result{}, nil
	}
	if err := z.markInProgress(ctx, &pvc, size); err != nil {
		return reconcile.Result{}, err
	}
	rec.Event(&pvc, corev1.EventTypeNormal, EventResizing, fmt.Sprintf("External resizer is resizing volume %s", pv.Name))
	resp, err := z.expand(ctx, &pv, size)
	if err != nil {
		werr := fmt.Errorf("resize volume %q by resizer %q failed: %w", pv.Name, driver, err)
		rec.Event(&pvc, corev1.EventTypeWarning, EventVolumeResizeFailed, werr.Error())
		if Retryable(err) || !isGRPC(err) {
			return reconcile.Result{}, werr
		}
		return reconcile.Result{}, z.markFailed(ctx, &pvc, err)
	}
	newSize := *resource.NewQuantity(resp.GetCapacityBytes(), resource.BinarySI)
	if have := pv.Spec.Capacity[corev1.ResourceStorage]; have.Cmp(newSize) != 0 {
		patch := client.MergeFrom(pv.DeepCopy())
		pv.Spec.Capacity[corev1.ResourceStorage] = newSize
		if err := z.c.Patch(ctx, &pv, patch); err != nil {
			return reconcile.Result{}, fmt.Errorf("updating capacity of PV %q to %s failed: %w", pv.Name, newSize.String(), err)
		}
	}
	if resp.GetNodeExpansionRequired() {
		if err := z.patchStatus(ctx, &pvc, func(s *corev1.PersistentVolumeClaimStatus) {
			s.Conditions = claimresize.MergeConditions(s.Conditions, corev1.PersistentVolumeClaimCondition{
				Type: corev1.PersistentVolumeClaimFileSystemResizePending, Status: corev1.ConditionTrue, Message: fsResizePendingMessage,
			})
			claimresize.SetStatus(s, corev1.PersistentVolumeClaimNodeResizePending)
		}); err != nil {
			return reconcile.Result{}, fmt.Errorf("marking PVC %s as node expansion required: %w", req.NamespacedName, err)
		}
		rec.Event(&pvc, corev1.EventTypeNormal, EventFileSystemResizeRequired, "Require file system resize of volume on node")
		return reconcile.Result{}, nil
	}
	if err := z.patchStatus(ctx, &pvc, func(s *corev1.PersistentVolumeClaimStatus) {
		if s.Capacity == nil {
			s.Capacity = corev1.ResourceList{}
		}
		s.Capacity[corev1.ResourceStorage] = newSize
		s.Conditions = claimresize.MergeConditions(s.Conditions)
		claimresize.SetStatus(s, "")
	}); err != nil {
		return reconcile.Result{}, fmt.Errorf("marking PVC %s as resized: %w", req.NamespacedName, err)
	}
	z.failed.Remove(pvc.UID)
	rec.Event(&pvc, corev1.EventTypeNormal, EventVolumeResizeSuccessful, "Resize volume succeeded")
	return reconcile.Result{}, nil
}

// expansionTarget is the size to expand pv to, as upstream's expandAndRecover picks it, and
// false when the controller has nothing to do: an expansion already handed to the node is
// the node's to finish, and one the controller started goes on to the size it recorded
// (allocatedResources) before a newer request is taken up.
func expansionTarget(pvc *corev1.PersistentVolumeClaim, pv *corev1.PersistentVolume) (resource.Quantity, bool) {
	requested := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	pvSize := pv.Spec.Capacity[corev1.ResourceStorage]
	allocated, hasAllocated := pvc.Status.AllocatedResources[corev1.ResourceStorage]
	size := requested
	switch pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] {
	case corev1.PersistentVolumeClaimNodeResizePending, corev1.PersistentVolumeClaimNodeResizeInProgress:
		if hasAllocated {
			size = allocated
		}
		if pvSize.Cmp(size) >= 0 {
			return size, false // the node's turn
		}
	case corev1.PersistentVolumeClaimNodeResizeInfeasible, corev1.PersistentVolumeClaimControllerResizeInProgress:
		if hasAllocated {
			size = allocated
		}
	case corev1.PersistentVolumeClaimControllerResizeInfeasible:
		// The user may have lowered a request the driver refused: the new one is taken.
	default:
		if pvSize.Cmp(requested) >= 0 && hasCondition(pvc, corev1.PersistentVolumeClaimFileSystemResizePending) {
			return size, false
		}
	}
	return size, true
}

// markInProgress records that the controller expands the claim to size: condition
// Resizing, allocatedResources and allocatedResourceStatuses ControllerResizeInProgress.
// Nothing is written when that is what the claim says already.
func (z *resizer) markInProgress(ctx context.Context, pvc *corev1.PersistentVolumeClaim, size resource.Quantity) error {
	if a, ok := pvc.Status.AllocatedResources[corev1.ResourceStorage]; ok && a.Cmp(size) == 0 &&
		pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] == corev1.PersistentVolumeClaimControllerResizeInProgress &&
		hasCondition(pvc, corev1.PersistentVolumeClaimResizing) {
		return nil
	}
	err := z.patchStatus(ctx, pvc, func(s *corev1.PersistentVolumeClaimStatus) {
		s.Conditions = claimresize.MergeConditions(s.Conditions, corev1.PersistentVolumeClaimCondition{Type: corev1.PersistentVolumeClaimResizing, Status: corev1.ConditionTrue})
		claimresize.SetStatus(s, corev1.PersistentVolumeClaimControllerResizeInProgress)
		if s.AllocatedResources == nil {
			s.AllocatedResources = corev1.ResourceList{}
		}
		s.AllocatedResources[corev1.ResourceStorage] = size
	})
	if err != nil {
		return fmt.Errorf("marking PVC %s/%s as resizing: %w", pvc.Namespace, pvc.Name, err)
	}
	return nil
}

// markFailed records a final failure: condition ControllerResizeError with the driver's
// message, and ControllerResizeInfeasible when the driver refuses the size itself. The
// claim is not tried again until it changes.
func (z *resizer) markFailed(ctx context.Context, pvc *corev1.PersistentVolumeClaim, cause error) error {
	err := z.patchStatus(ctx, pvc, func(s *corev1.PersistentVolumeClaimStatus) {
		s.Conditions = claimresize.MergeConditions(s.Conditions, corev1.PersistentVolumeClaimCondition{
			Type: corev1.PersistentVolumeClaimControllerResizeError, Status: corev1.ConditionTrue,
			Message: fmt.Sprintf("CSI resizer failed to expand the volume: %s", status.Convert(cause).Message()),
		})
		switch status.Code(cause) {
		case codes.InvalidArgument, codes.OutOfRange, codes.NotFound:
			claimresize.SetStatus(s, corev1.PersistentVolumeClaimControllerResizeInfeasible)
		}
	})
	if err != nil {
		return fmt.Errorf("recording the failed expansion of PVC %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	requested := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	z.failed.Add(pvc.UID, requested.String())
	z.log.Info("expansion failed, not retrying until the claim asks for another size", "claim", client.ObjectKeyFromObject(pvc), "error", cause.Error())
	return nil
}

// expand calls ControllerExpandVolume for pv to at least size.
func (z *resizer) expand(ctx context.Context, pv *corev1.PersistentVolume, size resource.Quantity) (*csi.ControllerExpandVolumeResponse, error) {
	required, err := storagev1alpha1.Bytes(size)
	if err != nil {
		return nil, status.Errorf(codes.OutOfRange, "storage of %s: %v", size.String(), err)
	}
	req := &csi.ControllerExpandVolumeRequest{VolumeId: pv.Spec.CSI.VolumeHandle, CapacityRange: &csi.CapacityRange{RequiredBytes: required}}
	if len(pv.Spec.AccessModes) > 0 {
		if c, err := capability(pv.Spec.AccessModes[0], pv.Spec.VolumeMode, pv.Spec.CSI.FSType, pv.Spec.MountOptions); err == nil {
			req.VolumeCapability = c
		}
	}
	cctx, cancel := context.WithTimeout(ctx, z.o.CallTimeout)
	defer cancel()
	return z.csi.ControllerExpandVolume(cctx, req)
}

// patchStatus applies change to the claim's status, guarded by its resourceVersion as
// upstream's resizer does: a claim that changed meanwhile is read again and the change
// applied to it again here (returning the conflict would have the driver called twice).
func (z *resizer) patchStatus(ctx context.Context, pvc *corev1.PersistentVolumeClaim, change func(*corev1.PersistentVolumeClaimStatus)) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		patch := client.MergeFromWithOptions(pvc.DeepCopy(), client.MergeFromWithOptimisticLock{})
		change(&pvc.Status)
		err := z.c.Status().Patch(ctx, pvc, patch)
		switch {
		case apierrors.IsConflict(err):
			if gerr := z.fresh.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); gerr != nil {
				return gerr
			}
			return err
		case err != nil && !apierrors.IsNotFound(err):
			return err
		}
		return nil
	})
}

func hasCondition(pvc *corev1.PersistentVolumeClaim, t corev1.PersistentVolumeClaimConditionType) bool {
	for _, c := range pvc.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
