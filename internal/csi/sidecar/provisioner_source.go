package sidecar

import (
	"context"
	"fmt"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// What filling a volume from a snapshot or a claim reads, as upstream's external-provisioner
// reads it (no write: the snapshot controller protects a snapshot a pending claim restores,
// and the driver a volume with snapshots, clones' included).
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshots,verbs=get
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshotcontents,verbs=get
// A claim restoring a backup reads its VolumeBackup, and the BackupStore's allowedNamespaces
// when the backup was made in another namespace.
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=volumebackups,verbs=get;list;watch
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=backupstores,verbs=get;list;watch

const (
	snapshotGroup = snapv1.GroupName
	// annAllowVolumeModeChange on a VolumeSnapshotContent lets a claim restore it in another
	// volume mode than its source's (upstream's name).
	annAllowVolumeModeChange = "snapshot.storage.kubernetes.io/allow-volume-mode-change"
	// finalizerSnapshotAsSource is the snapshot controller's finalizer on a VolumeSnapshot a
	// pending claim restores: while it holds, a snapshot being deleted may still be restored.
	finalizerSnapshotAsSource = "snapshot.storage.kubernetes.io/volumesnapshot-as-source-protection"
)

// notYet is a content source that may become usable: the snapshot is not ready yet, the
// claim to clone not bound yet. The claim is tried again with backoff, the message in a
// ProvisioningFailed Event each time.
type notYet struct{ err error }

func (e *notYet) Error() string { return e.err.Error() }
func (e *notYet) Unwrap() error { return e.err }

func waiting(format string, a ...any) error { return &notYet{err: fmt.Errorf(format, a...)} }

// source is a claim's data source as a reference: dataSource, else dataSourceRef (which may
// name a namespace), as upstream's external-provisioner reads them.
type source struct {
	group, kind, namespace, name string
}

func (s source) String() string {
	gk := s.kind
	if s.group != "" {
		gk += "." + s.group
	}
	return gk + " " + s.namespace + "/" + s.name
}

func dataSource(pvc *corev1.PersistentVolumeClaim) (source, bool) {
	var s source
	switch {
	case pvc.Spec.DataSource != nil:
		ds := pvc.Spec.DataSource
		s = source{kind: ds.Kind, name: ds.Name, namespace: pvc.Namespace}
		if ds.APIGroup != nil {
			s.group = *ds.APIGroup
		}
	case pvc.Spec.DataSourceRef != nil:
		ds := pvc.Spec.DataSourceRef
		s = source{kind: ds.Kind, name: ds.Name, namespace: pvc.Namespace}
		if ds.APIGroup != nil {
			s.group = *ds.APIGroup
		}
		if ds.Namespace != nil && *ds.Namespace != "" {
			s.namespace = *ds.Namespace
		}
	default:
		return source{}, false
	}
	return s, true
}

// contentSource translates the claim's data source into CreateVolume's content source: a
// VolumeSnapshot of the driver, ready to use, to its snapshot handle; a bound claim of the
// same namespace whose PV is the driver's to its volume handle. required is what the claim
// asks for, which must hold the source. A source that is not usable yet is a notYet error;
// any other error is final.
func (p *provisioner) contentSource(ctx context.Context, pvc *corev1.PersistentVolumeClaim, required int64, params map[string]string) (*csi.VolumeContentSource, error) {
	src, ok := dataSource(pvc)
	if !ok {
		return nil, nil
	}
	if src.name == "" {
		return nil, fmt.Errorf("the claim's data source %s names no object", src)
	}
	if src.namespace != pvc.Namespace {
		return nil, fmt.Errorf("the claim's data source %s is in another namespace: cross-namespace data sources are not supported", src)
	}
	switch {
	case src.group == snapshotGroup && src.kind == "VolumeSnapshot":
		return p.snapshotSource(ctx, pvc, src, required)
	case src.group == "" && src.kind == "PersistentVolumeClaim":
		return p.cloneSource(ctx, pvc, src, required)
	case src.group == storagev1alpha1.GroupVersion.Group && src.kind == "VolumeBackup" && p.driver == storagev1alpha1.CSIDriverName:
		ref, err := p.backupSource(ctx, src, required)
		if err != nil {
			return nil, err
		}
		params[storagev1alpha1.CSIParamBackup] = ref
		return nil, nil
	}
	if p.driver == storagev1alpha1.CSIDriverName {
		return nil, fmt.Errorf("the claim's data source %s is neither a VolumeSnapshot (%s), a PersistentVolumeClaim nor a VolumeBackup (%s): %s fills volumes from those only", src, snapshotGroup, storagev1alpha1.GroupVersion.Group, p.driver)
	}
	return nil, fmt.Errorf("the claim's data source %s is neither a VolumeSnapshot (%s) nor a PersistentVolumeClaim: %s fills volumes from those only", src, snapshotGroup, p.driver)
}

// backupSource: a VolumeBackup (crdipc's own kind, a volume populator's source in KEP-1495's
// terms) must be Completed, no larger than the claim, and made in the claim's namespace
// unless its store lets that namespace restore it; it becomes the CreateVolume parameter
// "<store>/<backup id>". The operator refuses a VolumeBackup that names another namespace's
// backup; this check is for one it completed before it did (or before the store's owner
// took the namespace off allowedNamespaces): the claim waits, saying why, until allowed.
func (p *provisioner) backupSource(ctx context.Context, src source, required int64) (string, error) {
	var b storagev1alpha1.VolumeBackup
	if err := p.c.Get(ctx, client.ObjectKey{Namespace: src.namespace, Name: src.name}, &b); apierrors.IsNotFound(err) {
		return "", waiting("VolumeBackup %s/%s does not exist (yet)", src.namespace, src.name)
	} else if err != nil {
		return "", waiting("reading VolumeBackup %s/%s: %w", src.namespace, src.name, err)
	}
	if b.Status.Phase == storagev1alpha1.BackupFailed {
		msg := ""
		if c := meta.FindStatusCondition(b.Status.Conditions, conditions.TypeReady); c != nil {
			msg = ": " + c.Message
		}
		return "", waiting("VolumeBackup %s/%s failed%s", b.Namespace, b.Name, msg)
	}
	if b.Status.Phase != storagev1alpha1.BackupCompleted || b.Status.BackupID == "" {
		return "", waiting("VolumeBackup %s/%s is %s, not Completed yet", b.Namespace, b.Name, b.Status.Phase)
	}
	// A backup made here is this namespace's; one found in the store is the namespace's
	// its manifest names, as the operator recorded it.
	origin := b.Status.OriginNamespace
	if b.Spec.Source != nil {
		origin = b.Namespace
	}
	if origin != src.namespace {
		var store storagev1alpha1.BackupStore
		if err := p.c.Get(ctx, client.ObjectKey{Name: b.Spec.Store}, &store); apierrors.IsNotFound(err) {
			return "", waiting("VolumeBackup %s/%s: its store %s does not exist", b.Namespace, b.Name, b.Spec.Store)
		} else if err != nil {
			return "", waiting("reading BackupStore %s: %w", b.Spec.Store, err)
		}
		if !store.MayRestore(origin, src.namespace) {
			why := "was made in another namespace"
			if origin == "" {
				why = "records no namespace it was made in (or the operator has not read it yet)"
			}
			return "", waiting("VolumeBackup %s/%s names backup %s of store %s, which %s: a backup is restored only in the namespace it was made in, unless the BackupStore's spec.allowedNamespaces names this one", b.Namespace, b.Name, b.Status.BackupID, store.Name, why)
		}
	}
	if b.Status.Size != nil {
		if n, err := storagev1alpha1.Bytes(*b.Status.Size); err == nil && n > required {
			return "", fmt.Errorf("VolumeBackup %s/%s holds %s, more than the claim requests (%d bytes): request at least its size", b.Namespace, b.Name, b.Status.Size.String(), required)
		}
	}
	return b.Spec.Store + "/" + b.Status.BackupID, nil
}

// snapshotSource: the VolumeSnapshot must be bound to a content of the driver and ready to
// use, and the claim at least its restore size (checks and messages after upstream's
// external-provisioner).
func (p *provisioner) snapshotSource(ctx context.Context, pvc *corev1.PersistentVolumeClaim, src source, required int64) (*csi.VolumeContentSource, error) {
	vs, err := p.snaps.SnapshotV1().VolumeSnapshots(src.namespace).Get(ctx, src.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, waiting("VolumeSnapshot %s/%s does not exist (yet)", src.namespace, src.name)
	} else if err != nil {
		return nil, waiting("reading VolumeSnapshot %s/%s: %w", src.namespace, src.name, err)
	}
	if !vs.DeletionTimestamp.IsZero() && !slices.Contains(vs.Finalizers, finalizerSnapshotAsSource) {
		return nil, waiting("VolumeSnapshot %s/%s is being deleted", vs.Namespace, vs.Name)
	}
	if vs.Status == nil || vs.Status.BoundVolumeSnapshotContentName == nil || *vs.Status.BoundVolumeSnapshotContentName == "" {
		return nil, waiting("VolumeSnapshot %s/%s is not bound to a VolumeSnapshotContent yet", vs.Namespace, vs.Name)
	}
	contentName := *vs.Status.BoundVolumeSnapshotContentName
	content, err := p.snaps.SnapshotV1().VolumeSnapshotContents().Get(ctx, contentName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, waiting("VolumeSnapshotContent %s of VolumeSnapshot %s/%s does not exist (yet)", contentName, vs.Namespace, vs.Name)
	} else if err != nil {
		return nil, waiting("reading VolumeSnapshotContent %s of VolumeSnapshot %s/%s: %w", contentName, vs.Namespace, vs.Name, err)
	}
	if ref := content.Spec.VolumeSnapshotRef; ref.UID != vs.UID || ref.Namespace != vs.Namespace || ref.Name != vs.Name {
		return nil, waiting("VolumeSnapshotContent %s is bound to VolumeSnapshot %s/%s (uid %s), not to %s/%s (uid %s)", content.Name, ref.Namespace, ref.Name, ref.UID, vs.Namespace, vs.Name, vs.UID)
	}
	if content.Spec.Driver != p.driver {
		return nil, fmt.Errorf("VolumeSnapshot %s/%s was taken by driver %q (VolumeSnapshotContent %s), not by %s: it cannot fill a volume of %s", vs.Namespace, vs.Name, content.Spec.Driver, content.Name, p.driver, p.driver)
	}
	if vs.Status.ReadyToUse == nil || !*vs.Status.ReadyToUse {
		msg := ""
		if e := vs.Status.Error; e != nil && e.Message != nil {
			msg = ": " + *e.Message
		}
		return nil, waiting("VolumeSnapshot %s/%s is not ready to use yet%s", vs.Namespace, vs.Name, msg)
	}
	if content.Status == nil || content.Status.SnapshotHandle == nil || *content.Status.SnapshotHandle == "" {
		return nil, waiting("VolumeSnapshotContent %s has no snapshot handle yet", content.Name)
	}
	if rs := vs.Status.RestoreSize; rs != nil {
		n, err := storagev1alpha1.Bytes(*rs)
		if err != nil {
			return nil, fmt.Errorf("VolumeSnapshot %s/%s has restore size %s: %w", vs.Namespace, vs.Name, rs.String(), err)
		}
		if required < n {
			return nil, fmt.Errorf("the claim requests %s, less than the %s VolumeSnapshot %s/%s restores: request at least that", quantity(required), rs.String(), vs.Namespace, vs.Name)
		}
	}
	// As upstream with --prevent-volume-mode-conversion (its default): a snapshot of a block
	// volume restores as a block volume unless its content allows a change.
	if from := content.Spec.SourceVolumeMode; from != nil && *from != volumeMode(pvc) && content.Annotations[annAllowVolumeModeChange] != "true" {
		return nil, fmt.Errorf("VolumeSnapshot %s/%s is of a %s volume and the claim asks for %s: VolumeSnapshotContent %s does not allow a change of volume mode (annotation %s)",
			vs.Namespace, vs.Name, *from, volumeMode(pvc), content.Name, annAllowVolumeModeChange)
	}
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
		Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: *content.Status.SnapshotHandle},
	}}, nil
}

// cloneSource: the claim to clone must be bound, in the same namespace, to a PV of the driver
// in the same volume mode, not being deleted (unless it is kept for this clone already), and
// the new claim at least its size. It is then kept for the clone (protect) before the
// clone's volume is asked for.
func (p *provisioner) cloneSource(ctx context.Context, pvc *corev1.PersistentVolumeClaim, src source, required int64) (*csi.VolumeContentSource, error) {
	if src.name == pvc.Name {
		return nil, fmt.Errorf("the claim names itself as its data source")
	}
	from, err := p.kube.CoreV1().PersistentVolumeClaims(src.namespace).Get(ctx, src.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, waiting("claim %s/%s, the data source, does not exist (yet)", src.namespace, src.name)
	} else if err != nil {
		return nil, waiting("reading claim %s/%s, the data source: %w", src.namespace, src.name, err)
	}
	if !from.DeletionTimestamp.IsZero() && !slices.Contains(clonesInProgress(from), pvc.UID) {
		// A clone started before the deletion goes on: the source is kept for it.
		return nil, sourceDeleting(from)
	}
	if from.Status.Phase != corev1.ClaimBound || from.Spec.VolumeName == "" {
		return nil, waiting("claim %s/%s, the data source, is not bound yet (phase %s)", from.Namespace, from.Name, from.Status.Phase)
	}
	pv, err := p.kube.CoreV1().PersistentVolumes().Get(ctx, from.Spec.VolumeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, waiting("PV %s of claim %s/%s does not exist", from.Spec.VolumeName, from.Namespace, from.Name)
	} else if err != nil {
		return nil, waiting("reading PV %s of claim %s/%s: %w", from.Spec.VolumeName, from.Namespace, from.Name, err)
	}
	if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != p.driver {
		driver := "a volume of no CSI driver"
		if pv.Spec.CSI != nil {
			driver = fmt.Sprintf("a volume of driver %q", pv.Spec.CSI.Driver)
		}
		return nil, fmt.Errorf("claim %s/%s is bound to PV %s, %s: %s clones only its own volumes", from.Namespace, from.Name, pv.Name, driver, p.driver)
	}
	if ref := pv.Spec.ClaimRef; ref == nil || ref.UID != from.UID || ref.Namespace != from.Namespace || ref.Name != from.Name || pv.Status.Phase != corev1.VolumeBound {
		return nil, waiting("PV %s is not bound to claim %s/%s (phase %s)", pv.Name, from.Namespace, from.Name, pv.Status.Phase)
	}
	if have, want := pvMode(pv), volumeMode(pvc); have != want {
		return nil, fmt.Errorf("claim %s/%s is a %s volume and the claim asks for %s: a clone keeps its source's volume mode", from.Namespace, from.Name, have, want)
	}
	if c, ok := pv.Spec.Capacity[corev1.ResourceStorage]; ok {
		n, err := storagev1alpha1.Bytes(c)
		if err != nil {
			return nil, fmt.Errorf("PV %s has capacity %s: %w", pv.Name, c.String(), err)
		}
		if required < n {
			return nil, fmt.Errorf("the claim requests %s, less than the %s of claim %s/%s it clones: request at least that", quantity(required), c.String(), from.Namespace, from.Name)
		}
	}
	if err := p.clones.protect(ctx, pvc, from); err != nil {
		return nil, err
	}
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
		Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: pv.Spec.CSI.VolumeHandle},
	}}, nil
}

func volumeMode(pvc *corev1.PersistentVolumeClaim) corev1.PersistentVolumeMode {
	if pvc.Spec.VolumeMode != nil {
		return *pvc.Spec.VolumeMode
	}
	return corev1.PersistentVolumeFilesystem
}

func pvMode(pv *corev1.PersistentVolume) corev1.PersistentVolumeMode {
	if pv.Spec.VolumeMode != nil {
		return *pv.Spec.VolumeMode
	}
	return corev1.PersistentVolumeFilesystem
}

// quantity writes n bytes as Kubernetes does (64Mi).
func quantity(n int64) string { return resource.NewQuantity(n, resource.BinarySI).String() }
