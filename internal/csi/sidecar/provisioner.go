package sidecar

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	snapclientset "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/lru"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/ipc"
)

// ParamFSType is the StorageClass parameter naming the file system of mount volumes, as
// upstream's external-provisioner spells it.
const ParamFSType = "csi.storage.k8s.io/fstype"

// provisioner implements the library's Provisioner with CSI calls.
type provisioner struct {
	driver string
	csi    csi.ControllerClient
	c      client.Client
	// kube and snaps read a claim's data source from the API server, as upstream does.
	kube  kubernetes.Interface
	snaps snapclientset.Interface
	o     Options
	rec   record.EventRecorder
	log   logr.Logger
	// clones keeps the sources of the clones being provisioned (provisioner_clone.go).
	clones *cloneProtection
	// failed holds the claims whose provisioning failed for good (a final code, or a claim
	// no request can be made of), by UID, with the resourceVersion that failed. The library
	// looks at a pending claim again on every resync and update; only a changed claim is
	// worth another call. Bounded: a forgotten claim costs one more call, as after a restart.
	failed *lru.Cache
}

// failedClaimsRemembered bounds provisioner.failed.
const failedClaimsRemembered = 4096

var (
	_ controller.Qualifier        = (*provisioner)(nil)
	_ controller.BlockProvisioner = (*provisioner)(nil)
)

// SupportsBlock implements controller.BlockProvisioner: the library refuses every claim of
// volumeMode Block of a provisioner that does not say yes. CSI has no call to ask a driver
// beforehand (upstream's external-provisioner says yes too); CreateVolume answers a block
// capability, and crdipc's driver serves block volumes.
func (p *provisioner) SupportsBlock(context.Context) bool { return true }

// ShouldProvision implements controller.Qualifier: not a claim that failed for good and has
// not changed since.
func (p *provisioner) ShouldProvision(_ context.Context, pvc *corev1.PersistentVolumeClaim) bool {
	if rv, ok := p.failed.Get(pvc.UID); ok && rv == pvc.ResourceVersion {
		p.log.V(1).Info("not retrying a claim that failed for good until it changes", "claim", client.ObjectKeyFromObject(pvc), "resourceVersion", rv)
		return false
	}
	return true
}

// newProvisioner returns the library's controller for driver name. Its state machine is
// upstream's: PVC → Provision → PV with claimRef (bound by the PV binder in the control
// plane), provisioned-by annotation and finalizer; released PV → Delete → PV removed.
//
// It is built once the manager runs (the driver's name may be learned only then), while the
// process's other clients decode with client-go's scheme: in up, the control plane's
// controllers and the services started earlier. The library as released writes that scheme
// in NewProvisionController ("concurrent map read and map write"); go.mod builds it from
// third_party/sig-storage-lib-external-provisioner, which does not.
func newProvisioner(ctx context.Context, cfg *rest.Config, kube kubernetes.Interface, c client.Client, name string, cc csi.ControllerClient, clones *cloneProtection, o Options, rec record.EventRecorder, l logr.Logger) (*controller.ProvisionController, error) {
	snaps, err := snapclientset.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("csi sidecar: %w", err)
	}
	p := &provisioner{driver: name, csi: cc, c: c, kube: kube, snaps: snaps, o: o, rec: rec, log: l, failed: lru.New(failedClaimsRemembered), clones: clones}
	ctx = klog.NewContext(ctx, l)
	return controller.NewProvisionController(ctx, kube, name, p,
		// The manager elects the leader; a second election inside would only add latency.
		controller.LeaderElection(false),
		controller.AddFinalizer(true),
		controller.ResyncPeriod(o.Resync),
		// Retryable failures back off exponentially, BackoffBase doubling to BackoffMax, and
		// never give up: a PVC waiting for a node to join must be provisioned when it joins.
		controller.RateLimiter(workqueue.NewTypedItemExponentialFailureRateLimiter[string](o.BackoffBase, o.BackoffMax)),
		controller.FailedProvisionThreshold(0),
		controller.FailedDeleteThreshold(0),
		controller.ProvisionTimeout(o.CallTimeout),
		controller.DeletionTimeout(o.CallTimeout),
	), nil
}

// Provision implements controller.Provisioner. A clone is provisioned only while its claim
// still wants it (the library goes on with a deleted claim it was provisioning; the
// clone-protection reconciler deletes what was begun for it), and, once started, with its
// source protected (provisioner_clone.go).
func (p *provisioner) Provision(ctx context.Context, opts controller.ProvisionOptions) (_ *corev1.PersistentVolume, _ controller.ProvisioningState, err error) {
	pvc, class := opts.PVC, opts.StorageClass
	ctx, span := ipc.StartSpan(ctx, p.o.TracerProvider, "provision PersistentVolumeClaim", pvc)
	defer func() { ipc.EndSpan(span, err) }()
	_, clone := cloneOf(pvc)
	if clone {
		unlock, ok := p.clones.busy.tryLock(pvc.UID)
		if !ok {
			return nil, controller.ProvisioningNoChange, waiting("the volume begun for claim %s/%s is being deleted", pvc.Namespace, pvc.Name)
		}
		defer unlock()
		if gone, err := p.clones.gone(ctx, pvc); err != nil {
			return nil, controller.ProvisioningNoChange, err
		} else if gone {
			return nil, controller.ProvisioningFinished, &controller.IgnoredError{Reason: fmt.Sprintf("claim %s/%s (uid %s) is deleted: its clone is not provisioned", pvc.Namespace, pvc.Name, pvc.UID)}
		}
	}
	req, err := p.createRequest(ctx, opts)
	if wait := (*notYet)(nil); errors.As(err, &wait) {
		// No volume was asked for: nothing is in progress. The library records a
		// ProvisioningFailed Event with the message and tries again with backoff.
		return nil, controller.ProvisioningNoChange, err
	} else if err != nil {
		return nil, controller.ProvisioningFinished, p.final(pvc, err)
	}
	cctx, cancel := context.WithTimeout(ctx, p.o.CallTimeout)
	defer cancel()
	resp, err := p.csi.CreateVolume(cctx, req)
	if err != nil {
		if Retryable(err) {
			// The library records a ProvisioningFailed Event with this message and requeues
			// the claim with backoff; the driver keeps the half-made volume, and the next
			// call with the same name picks it up.
			if status.Code(err) == codes.Unavailable {
				// Nothing answered: say where the sidecar looked, so a wrong endpoint or a
				// stopped driver is one `kubectl describe pvc` away.
				p.log.Error(err, "the CSI driver cannot be reached", "endpoint", p.o.DriverEndpoint, "claim", client.ObjectKeyFromObject(pvc))
				return nil, controller.ProvisioningInBackground, fmt.Errorf("the CSI driver at %s is unreachable (CreateVolume %s): %w", p.o.DriverEndpoint, req.Name, err)
			}
			return nil, controller.ProvisioningInBackground, fmt.Errorf("CreateVolume %s: %w", req.Name, err)
		}
		err = fmt.Errorf("CreateVolume %s: %w", req.Name, err)
		if clone {
			// Given up: what was begun goes, and the source is released. Not given up until
			// then, or the source would be kept for a clone no one provisions.
			if rerr := p.clones.release(ctx, pvc); rerr != nil {
				return nil, controller.ProvisioningInBackground, fmt.Errorf("%w; releasing the clone's source: %w", err, rerr)
			}
		}
		return nil, controller.ProvisioningFinished, p.final(pvc, err)
	}
	vol := resp.GetVolume()
	reclaim := corev1.PersistentVolumeReclaimDelete
	if class.ReclaimPolicy != nil {
		reclaim = *class.ReclaimPolicy
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: opts.PVName},
		Spec: corev1.PersistentVolumeSpec{
			AccessModes:                   pvc.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: reclaim,
			MountOptions:                  class.MountOptions,
			VolumeMode:                    pvc.Spec.VolumeMode,
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: *resource.NewQuantity(vol.GetCapacityBytes(), resource.BinarySI)},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver:           p.driver,
				VolumeHandle:     vol.GetVolumeId(),
				FSType:           fsType(pvc, class),
				VolumeAttributes: vol.GetVolumeContext(),
			}},
		},
	}
	return pv, controller.ProvisioningFinished, nil
}

// createRequest translates a claim and its class into a CreateVolume request named
// pvc-<PVC UID> (the library's PV name), so a retry after a crash asks for the same volume;
// a claim with a data source gets its content source (a notYet error while the source is not
// usable yet).
func (p *provisioner) createRequest(ctx context.Context, opts controller.ProvisionOptions) (*csi.CreateVolumeRequest, error) {
	pvc, class := opts.PVC, opts.StorageClass
	size, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok || size.Sign() <= 0 {
		return nil, fmt.Errorf("claim %s/%s requests no storage", pvc.Namespace, pvc.Name)
	}
	// Checked, not Quantity.Value, which wraps some values past an int64 around to
	// negative ones. (Binary suffixes are clamped when parsed: 16Ei arrives as 2^63-1,
	// which the driver refuses with OutOfRange.)
	required, err := storagev1alpha1.Bytes(size)
	if err != nil {
		return nil, fmt.Errorf("claim %s/%s requests storage of %s: %w", pvc.Namespace, pvc.Name, size.String(), err)
	}
	var limit int64
	if l, ok := pvc.Spec.Resources.Limits[corev1.ResourceStorage]; ok && l.Sign() > 0 {
		if limit, err = storagev1alpha1.Bytes(l); err != nil {
			// A limit past every byte count limits nothing.
			limit = math.MaxInt64
		}
	}
	params := map[string]string{}
	for k, v := range class.Parameters {
		if k == ParamFSType {
			continue
		}
		params[k] = v
	}
	var caps []*csi.VolumeCapability
	for _, m := range pvc.Spec.AccessModes {
		c, err := capability(m, pvc.Spec.VolumeMode, fsType(pvc, class), class.MountOptions)
		if err != nil {
			return nil, err
		}
		caps = append(caps, c)
	}
	if len(caps) == 0 {
		return nil, fmt.Errorf("claim %s/%s has no access modes", pvc.Namespace, pvc.Name)
	}
	src, err := p.contentSource(ctx, pvc, required, params)
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeRequest{
		Name:                opts.PVName,
		CapacityRange:       &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit},
		Parameters:          params,
		VolumeCapabilities:  caps,
		VolumeContentSource: src,
	}, nil
}

func fsType(pvc *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) string {
	if pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		return ""
	}
	if t := class.Parameters[ParamFSType]; t != "" {
		return t
	}
	return "ext4"
}

// capability maps a Kubernetes access mode and volume mode to a CSI capability.
func capability(m corev1.PersistentVolumeAccessMode, vm *corev1.PersistentVolumeMode, fs string, mountOptions []string) (*csi.VolumeCapability, error) {
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{}}
	switch m {
	case corev1.ReadWriteOnce:
		c.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	case corev1.ReadWriteOncePod:
		c.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	case corev1.ReadOnlyMany:
		c.AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	case corev1.ReadWriteMany:
		c.AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	default:
		return nil, fmt.Errorf("unknown access mode %q", m)
	}
	if vm != nil && *vm == corev1.PersistentVolumeBlock {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs, MountFlags: mountOptions}}
	}
	return c, nil
}

// final records a final failure as a Warning Event on the claim, with the driver's message,
// and tells the library to stop: final codes (OutOfRange for a size no pool could ever hold,
// InvalidArgument, AlreadyExists, …) are not retried, and the claim is not tried again until
// it changes (ShouldProvision).
func (p *provisioner) final(pvc *corev1.PersistentVolumeClaim, err error) error {
	p.rec.Event(pvc, corev1.EventTypeWarning, "ProvisioningFailed", err.Error())
	p.log.Info("provisioning failed, not retrying until the claim changes", "claim", client.ObjectKeyFromObject(pvc), "error", err.Error())
	p.failed.Add(pvc.UID, pvc.ResourceVersion)
	return &controller.IgnoredError{Reason: err.Error()}
}

// Delete implements controller.Provisioner. It refuses while a VolumeAttachment references
// the PV (the library retries with backoff and records VolumeFailedDelete), then deletes the
// volume; the library removes the PV after.
func (p *provisioner) Delete(ctx context.Context, pv *corev1.PersistentVolume) error {
	src := pv.Spec.CSI
	if src == nil || src.Driver != p.driver {
		return &controller.IgnoredError{Reason: "not a volume of " + p.driver}
	}
	var vas storagev1.VolumeAttachmentList
	if err := p.c.List(ctx, &vas); err != nil {
		return fmt.Errorf("listing volume attachments: %w", err)
	}
	var nodes []string
	for _, va := range vas.Items {
		if n := va.Spec.Source.PersistentVolumeName; n != nil && *n == pv.Name {
			nodes = append(nodes, va.Spec.NodeName)
		}
	}
	if len(nodes) > 0 {
		return fmt.Errorf("volume %s is still attached to %s; waiting for it to be detached", pv.Name, strings.Join(nodes, ", "))
	}
	cctx, cancel := context.WithTimeout(ctx, p.o.CallTimeout)
	defer cancel()
	if _, err := p.csi.DeleteVolume(cctx, &csi.DeleteVolumeRequest{VolumeId: src.VolumeHandle}); err != nil {
		return fmt.Errorf("DeleteVolume %s: %w", src.VolumeHandle, err)
	}
	return nil
}
