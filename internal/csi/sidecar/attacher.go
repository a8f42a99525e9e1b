package sidecar

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// AttacherFinalizer returns the finalizer the attacher puts on VolumeAttachments of driver,
// spelled as upstream's external-attacher does so tools that know it recognise it.
func AttacherFinalizer(driver string) string {
	return "external-attacher/" + strings.NewReplacer("/", "-", ".", "-").Replace(driver)
}

// started is what the sidecar's controllers learn once it starts: the driver's name and
// the Event recorder that reports as its sidecar. Until then both are empty.
type started struct {
	mu     sync.Mutex
	driver string
	rec    record.EventRecorder
}

func (s *started) set(name string, r record.EventRecorder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.driver, s.rec = name, r
}

func (s *started) state() (string, record.EventRecorder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.driver, s.rec
}

// attacher reconciles VolumeAttachments whose attacher is the driver.
type attacher struct {
	*started
	c   client.Client
	csi csi.ControllerClient
	o   Options
	log logr.Logger
}

func (a *attacher) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("csi-attacher").
		For(&storagev1.VolumeAttachment{}).
		WithOptions(controller.Options{
			// Failures that are worth retrying back off BackoffBase doubling to BackoffMax.
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](a.o.BackoffBase, a.o.BackoffMax),
		}).
		Complete(a)
}

// Reconcile implements reconcile.Reconciler.
func (a *attacher) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	driver, rec := a.state()
	if driver == "" {
		// The driver has not told us its name yet; the sidecar is still starting.
		return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	var va storagev1.VolumeAttachment
	if err := a.c.Get(ctx, req.NamespacedName, &va); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if va.Spec.Attacher != driver {
		return reconcile.Result{}, nil
	}
	fin := AttacherFinalizer(driver)
	if !va.DeletionTimestamp.IsZero() {
		if !controllerutil.ContainsFinalizer(&va, fin) {
			return reconcile.Result{}, nil
		}
		return a.detach(ctx, &va, fin, rec)
	}
	if !controllerutil.ContainsFinalizer(&va, fin) {
		// The finalizer first: once ControllerPublish may have run, deleting the object must
		// come back here to unpublish.
		patch := client.MergeFromWithOptions(va.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(&va, fin)
		if err := a.c.Patch(ctx, &va, patch); err != nil {
			return reconcile.Result{}, fmt.Errorf("adding finalizer: %w", err)
		}
	}
	if va.Status.Attached {
		return reconcile.Result{}, nil
	}
	return a.attach(ctx, &va, rec)
}

func (a *attacher) attach(ctx context.Context, va *storagev1.VolumeAttachment, rec record.EventRecorder) (reconcile.Result, error) {
	req, err := a.publishRequest(ctx, va)
	if err != nil {
		return a.fail(ctx, va, rec, true, err)
	}
	cctx, cancel := context.WithTimeout(ctx, a.o.CallTimeout)
	defer cancel()
	resp, err := a.csi.ControllerPublishVolume(cctx, req)
	if err != nil {
		return a.fail(ctx, va, rec, true, fmt.Errorf("ControllerPublishVolume %s on %s: %w", req.VolumeId, req.NodeId, err))
	}
	patch := client.MergeFrom(va.DeepCopy())
	va.Status.Attached = true
	va.Status.AttachmentMetadata = resp.GetPublishContext()
	va.Status.AttachError = nil
	if err := a.c.Status().Patch(ctx, va, patch); err != nil {
		return reconcile.Result{}, fmt.Errorf("recording attachment: %w", err)
	}
	return reconcile.Result{}, nil
}

func (a *attacher) detach(ctx context.Context, va *storagev1.VolumeAttachment, fin string, rec record.EventRecorder) (reconcile.Result, error) {
	volumeID, err := a.volumeID(ctx, va)
	if err != nil && !apierrors.IsNotFound(err) {
		return a.fail(ctx, va, rec, false, err)
	}
	if err == nil {
		cctx, cancel := context.WithTimeout(ctx, a.o.CallTimeout)
		defer cancel()
		if _, err := a.csi.ControllerUnpublishVolume(cctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: volumeID, NodeId: va.Spec.NodeName}); err != nil {
			return a.fail(ctx, va, rec, false, fmt.Errorf("ControllerUnpublishVolume %s from %s: %w", volumeID, va.Spec.NodeName, err))
		}
	}
	// A PV already gone means its volume was deleted, which the driver allows only when it
	// is published nowhere: nothing to unpublish.
	if va.Status.Attached || va.Status.DetachError != nil {
		patch := client.MergeFrom(va.DeepCopy())
		va.Status.Attached = false
		va.Status.AttachmentMetadata = nil
		va.Status.DetachError = nil
		if err := a.c.Status().Patch(ctx, va, patch); err != nil && !apierrors.IsNotFound(err) {
			return reconcile.Result{}, fmt.Errorf("recording detachment: %w", err)
		}
	}
	patch := client.MergeFromWithOptions(va.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(va, fin)
	if err := a.c.Patch(ctx, va, patch); err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, fmt.Errorf("removing finalizer: %w", err)
	}
	return reconcile.Result{}, nil
}

// fail records err in status.attachError or status.detachError. A retryable error is
// returned, so the work queue retries it with backoff; a final one becomes a Warning Event
// and is not retried until the VolumeAttachment changes.
func (a *attacher) fail(ctx context.Context, va *storagev1.VolumeAttachment, rec record.EventRecorder, attaching bool, err error) (reconcile.Result, error) {
	patch := client.MergeFrom(va.DeepCopy())
	ve := &storagev1.VolumeError{Time: metav1.Now(), Message: err.Error()}
	reason := "AttachFailed"
	if attaching {
		va.Status.AttachError = ve
	} else {
		va.Status.DetachError = ve
		reason = "DetachFailed"
	}
	if perr := a.c.Status().Patch(ctx, va, patch); perr != nil && !apierrors.IsNotFound(perr) {
		a.log.Error(perr, "recording error", "volumeattachment", va.Name)
	}
	if Retryable(err) || !isGRPC(err) {
		return reconcile.Result{}, err
	}
	rec.Event(va, corev1.EventTypeWarning, reason, err.Error())
	a.log.Info("not retrying", "volumeattachment", va.Name, "error", err.Error())
	return reconcile.Result{}, nil
}

// publishRequest builds ControllerPublishVolume from the VolumeAttachment and its PV. The
// node ID is the Node's name: crdipc's driver reports node names from NodeGetInfo.
func (a *attacher) publishRequest(ctx context.Context, va *storagev1.VolumeAttachment) (*csi.ControllerPublishVolumeRequest, error) {
	spec, err := a.pvSpec(ctx, va)
	if err != nil {
		return nil, err
	}
	src := spec.CSI
	if src == nil || src.Driver != va.Spec.Attacher {
		return nil, fmt.Errorf("the volume of VolumeAttachment %s is not a %s CSI volume", va.Name, va.Spec.Attacher)
	}
	var c *csi.VolumeCapability
	for _, m := range spec.AccessModes {
		if c, err = capability(m, spec.VolumeMode, src.FSType, spec.MountOptions); err != nil {
			return nil, err
		}
		break
	}
	if c == nil {
		return nil, fmt.Errorf("the volume of VolumeAttachment %s has no access mode", va.Name)
	}
	return &csi.ControllerPublishVolumeRequest{
		VolumeId:         src.VolumeHandle,
		NodeId:           va.Spec.NodeName,
		VolumeCapability: c,
		Readonly:         src.ReadOnly,
		VolumeContext:    src.VolumeAttributes,
	}, nil
}

func (a *attacher) volumeID(ctx context.Context, va *storagev1.VolumeAttachment) (string, error) {
	spec, err := a.pvSpec(ctx, va)
	if err != nil {
		return "", err
	}
	if spec.CSI == nil {
		return "", fmt.Errorf("the volume of VolumeAttachment %s is not a CSI volume", va.Name)
	}
	return spec.CSI.VolumeHandle, nil
}

func (a *attacher) pvSpec(ctx context.Context, va *storagev1.VolumeAttachment) (*corev1.PersistentVolumeSpec, error) {
	if s := va.Spec.Source.InlineVolumeSpec; s != nil {
		return s, nil
	}
	if va.Spec.Source.PersistentVolumeName == nil {
		return nil, fmt.Errorf("VolumeAttachment %s names no volume", va.Name)
	}
	var pv corev1.PersistentVolume
	if err := a.c.Get(ctx, client.ObjectKey{Name: *va.Spec.Source.PersistentVolumeName}, &pv); err != nil {
		return nil, fmt.Errorf("reading PersistentVolume %s: %w", *va.Spec.Source.PersistentVolumeName, err)
	}
	return &pv.Spec, nil
}
