package operator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/storage/backup"
	"github.com/crdipc/crdipc/internal/storage/storeref"
	"github.com/crdipc/crdipc/ipc"
)

// The operator answers VolumeBackups up to the upload, which a node agent does: it takes the
// VolumeSnapshot of a PVC, finds the CStorVolumeSnapshot behind it and gives the backup to
// a node holding a copy. It reads stores and their Secrets to open them.
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=volumebackups,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=volumebackups/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=backupstores,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=backupstores/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get,namespace=crdipc-backup
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshots,verbs=get;create;delete
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshotcontents,verbs=get
// +kubebuilder:rbac:groups=snapshot.storage.k8s.io,resources=volumesnapshotclasses,verbs=list

// BackupFinalizer keeps a VolumeBackup whose deletionPolicy is Delete until its backup is
// deleted from the store.
const BackupFinalizer = "storage.crdipc.io/backup"

// backupPoll is how often a backup waiting on its snapshot or its upload is looked at again
// when nothing it watches says so first.
const backupPoll = 2 * time.Second

type backupHandler struct {
	c     client.Client
	live  client.Reader
	repos *repos
}

// Handle implements ipc.Handler.
func (h *backupHandler) Handle(ctx context.Context, b *storagev1alpha1.VolumeBackup) (ipc.Result, error) {
	st := &b.Status
	if b.Spec.Source != nil && st.Phase == storagev1alpha1.BackupCompleted {
		st.OriginNamespace = b.Namespace // (completed before the field was)
		return ipc.Done(completedMessage(b)), nil
	}
	var store storagev1alpha1.BackupStore
	if err := h.c.Get(ctx, client.ObjectKey{Name: b.Spec.Store}, &store); apierrors.IsNotFound(err) {
		st.Phase = storagev1alpha1.BackupPending
		return ipc.Waiting("StoreNotFound", fmt.Sprintf("backup store %s does not exist", b.Spec.Store), 30*time.Second), nil
	} else if err != nil {
		return ipc.Result{}, err
	}
	if b.Spec.Source == nil {
		return h.found(ctx, b, &store)
	}
	if st.BackupID == "" {
		st.BackupID = string(b.UID)
	}
	st.OriginNamespace = b.Namespace
	if c := meta.FindStatusCondition(store.Status.Conditions, conditions.TypeReady); c == nil || c.Status != metav1.ConditionTrue {
		msg := "not opened yet"
		if c != nil {
			msg = c.Message
		}
		st.Phase = storagev1alpha1.BackupPending
		return ipc.Waiting("StoreNotReady", fmt.Sprintf("backup store %s is not ready: %s", store.Name, msg), 30*time.Second), nil
	}
	if st.Phase == "" {
		st.Phase = storagev1alpha1.BackupPending
	}
	if st.Snapshot == "" {
		if res, waiting, err := h.snapshot(ctx, b); waiting || err != nil {
			return res, err
		}
	}
	if res, waiting, err := h.place(ctx, b); waiting || err != nil {
		return res, err
	}
	if st.CompletionTime == nil {
		if st.UploadError != "" {
			return ipc.Waiting("UploadFailed", fmt.Sprintf("upload on node %s failed; retrying: %s", st.Node, st.UploadError), backupPoll), nil
		}
		return ipc.Waiting("Uploading", fmt.Sprintf("uploading from node %s: %s of %s read, %d bytes in %d objects uploaded", st.Node, percent(st.BytesDone, st.Size), st.Size.String(), st.BytesUploaded, st.ObjectsUploaded), backupPoll), nil
	}
	// The snapshot was taken for the backup alone: its copies would hold pool space.
	if b.Spec.Source.PersistentVolumeClaimName != "" {
		if err := h.deleteOwnSnapshot(ctx, b); err != nil {
			return ipc.Result{}, err
		}
	}
	st.Phase = storagev1alpha1.BackupCompleted
	return ipc.Done(completedMessage(b)), nil
}

// snapshot takes (or finds) the backup's VolumeSnapshot and records the CStorVolumeSnapshot
// behind it once it is ready to use.
func (h *backupHandler) snapshot(ctx context.Context, b *storagev1alpha1.VolumeBackup) (_ ipc.Result, waiting bool, _ error) {
	st, src := &b.Status, b.Spec.Source
	name := src.VolumeSnapshotName
	if name == "" {
		name = BackupSnapshotName(b.Name)
		var pvc corev1.PersistentVolumeClaim
		if err := h.live.Get(ctx, client.ObjectKey{Namespace: b.Namespace, Name: src.PersistentVolumeClaimName}, &pvc); apierrors.IsNotFound(err) {
			return ipc.Waiting("SourceNotFound", fmt.Sprintf("PersistentVolumeClaim %s does not exist", src.PersistentVolumeClaimName), 30*time.Second), true, nil
		} else if err != nil {
			return ipc.Result{}, false, err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return ipc.Waiting("SourceNotBound", fmt.Sprintf("PersistentVolumeClaim %s is %s, not Bound", pvc.Name, pvc.Status.Phase), backupPoll), true, nil
		}
		if err := h.ensureSnapshot(ctx, b, name, pvc.Name); err != nil {
			return ipc.Result{}, false, err
		}
	}
	st.VolumeSnapshot = name
	st.Phase = storagev1alpha1.BackupSnapshotting
	var vs snapv1.VolumeSnapshot
	if err := h.live.Get(ctx, client.ObjectKey{Namespace: b.Namespace, Name: name}, &vs); apierrors.IsNotFound(err) {
		return ipc.Waiting("SourceNotFound", fmt.Sprintf("VolumeSnapshot %s does not exist", name), 30*time.Second), true, nil
	} else if err != nil {
		return ipc.Result{}, false, err
	}
	if claim := vs.Spec.Source.PersistentVolumeClaimName; claim != nil {
		st.Volume = b.Namespace + "/" + *claim
	}
	s := vs.Status
	if s == nil || s.ReadyToUse == nil || !*s.ReadyToUse || s.BoundVolumeSnapshotContentName == nil {
		msg := fmt.Sprintf("waiting for VolumeSnapshot %s to be ready to use", name)
		if s != nil && s.Error != nil && s.Error.Message != nil {
			msg += ": " + *s.Error.Message
		}
		return ipc.Waiting("Snapshotting", msg, backupPoll), true, nil
	}
	var content snapv1.VolumeSnapshotContent
	if err := h.live.Get(ctx, client.ObjectKey{Name: *s.BoundVolumeSnapshotContentName}, &content); err != nil {
		return ipc.Result{}, false, fmt.Errorf("VolumeSnapshotContent %s: %w", *s.BoundVolumeSnapshotContentName, err)
	}
	if content.Spec.Driver != storagev1alpha1.CSIDriverName {
		return ipc.Result{}, false, ipc.InvalidSpec("VolumeSnapshot %s is of driver %s: only crdipc volumes (%s) are backed up", name, content.Spec.Driver, storagev1alpha1.CSIDriverName)
	}
	if content.Status == nil || content.Status.SnapshotHandle == nil {
		return ipc.Waiting("Snapshotting", fmt.Sprintf("waiting for VolumeSnapshotContent %s to name its snapshot", content.Name), backupPoll), true, nil
	}
	var snap storagev1alpha1.CStorVolumeSnapshot
	if err := h.live.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: *content.Status.SnapshotHandle}, &snap); err != nil {
		return ipc.Result{}, false, fmt.Errorf("snapshot %s behind VolumeSnapshot %s: %w", *content.Status.SnapshotHandle, name, err)
	}
	if !snap.Status.ReadyToUse || snap.Status.Size == nil {
		return ipc.Waiting("Snapshotting", fmt.Sprintf("waiting for snapshot %s to be ready to use", snap.Name), backupPoll), true, nil
	}
	st.Snapshot, st.Size = snap.Name, ptr.To(snap.Status.Size.DeepCopy())
	return ipc.Result{}, false, nil
}

// ensureSnapshot creates the VolumeSnapshot of claim that the backup reads, owned by it.
func (h *backupHandler) ensureSnapshot(ctx context.Context, b *storagev1alpha1.VolumeBackup, name, claim string) error {
	var existing snapv1.VolumeSnapshot
	err := h.live.Get(ctx, client.ObjectKey{Namespace: b.Namespace, Name: name}, &existing)
	if err == nil {
		if !metav1.IsControlledBy(&existing, b) {
			return ipc.InvalidSpec("VolumeSnapshot %s exists and is not this backup's: rename the backup, or back up that snapshot (source.volumeSnapshotName)", name)
		}
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return err
	}
	class, err := h.snapshotClass(ctx)
	if err != nil {
		return err
	}
	vs := &snapv1.VolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: b.Namespace, Name: name, Labels: map[string]string{"app.kubernetes.io/managed-by": "crdipc-storage-operator"}},
		Spec: snapv1.VolumeSnapshotSpec{
			Source:                  snapv1.VolumeSnapshotSource{PersistentVolumeClaimName: &claim},
			VolumeSnapshotClassName: &class,
		},
	}
	if err := controllerutil.SetControllerReference(b, vs, h.c.Scheme()); err != nil {
		return err
	}
	if err := h.c.Create(ctx, vs); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating VolumeSnapshot %s: %w", name, err)
	}
	return nil
}

// snapshotClass is the VolumeSnapshotClass of crdipc's driver: the default one if several.
func (h *backupHandler) snapshotClass(ctx context.Context) (string, error) {
	var classes snapv1.VolumeSnapshotClassList
	if err := h.live.List(ctx, &classes); err != nil {
		return "", fmt.Errorf("listing VolumeSnapshotClasses: %w", err)
	}
	var names []string
	for _, c := range classes.Items {
		if c.Driver != storagev1alpha1.CSIDriverName {
			continue
		}
		if c.Annotations["snapshot.storage.kubernetes.io/is-default-class"] == "true" {
			return c.Name, nil
		}
		names = append(names, c.Name)
	}
	if len(names) == 0 {
		return "", ipc.Terminal("no VolumeSnapshotClass of driver %s exists (config/samples/csi/volumesnapshotclass.yaml is one)", storagev1alpha1.CSIDriverName)
	}
	slices.Sort(names)
	return names[0], nil
}

// place gives the backup to a Ready node holding a copy of its snapshot: the label lets that
// node's agent see it.
func (h *backupHandler) place(ctx context.Context, b *storagev1alpha1.VolumeBackup) (_ ipc.Result, waiting bool, _ error) {
	st := &b.Status
	// Once given, the backup stays with its node while that node is Ready and its upload
	// has not failed: each poll of a running upload reads only the Node, from the cache.
	if st.Node != "" && b.Labels[storagev1alpha1.LabelBackupNode] == st.Node && st.UploadError == "" {
		var n corev1.Node
		if err := h.c.Get(ctx, client.ObjectKey{Name: st.Node}, &n); err == nil && nodeIsReady(&n) {
			st.Phase = storagev1alpha1.BackupUploading
			return ipc.Result{}, false, nil
		}
	}
	var snap storagev1alpha1.CStorVolumeSnapshot
	if err := h.live.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: st.Snapshot}, &snap); err != nil {
		return ipc.Result{}, false, fmt.Errorf("snapshot %s: %w", st.Snapshot, err)
	}
	var candidates []string
	for _, c := range snap.Status.Copies {
		var n corev1.Node
		if err := h.c.Get(ctx, client.ObjectKey{Name: c.Node}, &n); err == nil && nodeIsReady(&n) {
			candidates = append(candidates, c.Node)
		}
	}
	// A node keeps its backup while it holds a copy and is Ready; the upload resumes there.
	if st.CompletionTime == nil && !slices.Contains(candidates, st.Node) {
		if len(candidates) == 0 {
			st.Phase = storagev1alpha1.BackupPending
			return ipc.Waiting("NoCopyAvailable", fmt.Sprintf("no Ready node holds a copy of snapshot %s", snap.Name), 10*time.Second), true, nil
		}
		st.Node = candidates[0]
	}
	if b.Labels[storagev1alpha1.LabelBackupNode] != st.Node {
		// Written apart from the status the receiver writes: a copy, so the status set above stays.
		cp := b.DeepCopy()
		patch := client.MergeFrom(cp.DeepCopy())
		if cp.Labels == nil {
			cp.Labels = map[string]string{}
		}
		cp.Labels[storagev1alpha1.LabelBackupNode] = st.Node
		if err := h.c.Patch(ctx, cp, patch); err != nil {
			return ipc.Result{}, false, fmt.Errorf("giving the backup to node %s: %w", st.Node, err)
		}
		b.Labels, b.ResourceVersion = cp.Labels, cp.ResourceVersion
	}
	st.Phase = storagev1alpha1.BackupUploading
	return ipc.Result{}, false, nil
}

// found answers a backup that was found in its store (or that names one, annotation
// storage.crdipc.io/backup-id): it is complete as the store has it, if the store lets the
// backup's namespace restore it. A backup's ID is no secret (the UID of the VolumeBackup that
// made it), so the manifest, not the name, says whose it is.
func (h *backupHandler) found(ctx context.Context, b *storagev1alpha1.VolumeBackup, store *storagev1alpha1.BackupStore) (ipc.Result, error) {
	st := &b.Status
	id := b.Annotations[storagev1alpha1.AnnotationBackupID]
	if id == "" {
		return ipc.Result{}, ipc.InvalidSpec("a backup without a source must name its backup in the store (annotation %s)", storagev1alpha1.AnnotationBackupID)
	}
	// Checked against its manifest already: only the store's allowance may have changed.
	if st.Phase == storagev1alpha1.BackupCompleted && st.BackupID == id && st.OriginNamespace != "" {
		if !store.MayRestore(st.OriginNamespace, b.Namespace) {
			return ipc.Result{}, refuse(b, store, id, st.OriginNamespace)
		}
		return ipc.Done(completedMessage(b)), nil
	}
	repo, err := h.repos.get(ctx, h.live, store)
	if err != nil {
		return ipc.Waiting("StoreNotReady", fmt.Sprintf("backup store %s: %v", store.Name, err), 30*time.Second), nil
	}
	m, err := repo.Manifest(ctx, id)
	if errors.Is(err, backup.ErrNotFound) {
		return ipc.Result{}, ipc.Terminal("backup %s is not in store %s", id, store.Name)
	} else if err != nil {
		return ipc.Waiting("StoreNotReady", err.Error(), 30*time.Second), nil
	}
	origin := m.Labels[storeref.ManifestNamespace]
	if !store.MayRestore(origin, b.Namespace) {
		return ipc.Result{}, refuse(b, store, id, origin)
	}
	st.BackupID, st.OriginNamespace, st.Volume, st.Phase = id, origin, m.Volume, storagev1alpha1.BackupCompleted
	st.Size = resource.NewQuantity(m.Size, resource.BinarySI)
	st.BytesDone, st.BytesUploaded, st.ObjectsUploaded = m.Size, m.Stats.UploadedBytes, m.Stats.Uploaded
	st.StartTime = &metav1.Time{Time: m.Created}
	return ipc.Done(completedMessage(b)), nil
}

// refuse fails b, which names a backup that its store does not let b's namespace restore.
// The status keeps nothing of that backup: no ID, so that neither the finalizer deletes it
// nor a claim is filled from it, and nothing of what it holds. The message does not name the
// backup's namespace either: b's namespace has no business learning it.
func refuse(b *storagev1alpha1.VolumeBackup, store *storagev1alpha1.BackupStore, id, origin string) error {
	b.Status = storagev1alpha1.VolumeBackupStatus{
		ObservedGeneration: b.Status.ObservedGeneration,
		Conditions:         b.Status.Conditions,
		Phase:              storagev1alpha1.BackupFailed,
	}
	why := "was made in another namespace"
	if origin == "" {
		why = "records no namespace (it was not made through a VolumeBackup)"
	}
	return ipc.Terminal("backup %s in store %s %s: a backup is restored only in the namespace it was made in, unless its BackupStore's spec.allowedNamespaces names this one (%s); ask the store's owner, a cluster administrator", id, store.Name, why, b.Namespace)
}

// Finalize implements ipc.Finalizer: a backup whose policy is Delete is deleted from its
// store first. The finalizer is on every backup; with Retain it lets go at once.
func (h *backupHandler) Finalize(ctx context.Context, b *storagev1alpha1.VolumeBackup) error {
	if b.Spec.DeletionPolicy != storagev1alpha1.BackupDelete || b.Status.BackupID == "" {
		return nil
	}
	var store storagev1alpha1.BackupStore
	if err := h.c.Get(ctx, client.ObjectKey{Name: b.Spec.Store}, &store); apierrors.IsNotFound(err) {
		return nil // nothing left to delete it from
	} else if err != nil {
		return err
	}
	repo, err := h.repos.get(ctx, h.live, &store)
	if err != nil {
		return fmt.Errorf("opening store %s to delete backup %s: %w", store.Name, b.Status.BackupID, err)
	}
	if b.Spec.Source == nil {
		// Named, not made here: deleted only by a VolumeBackup of the namespace it was made
		// in. One that the store lets another namespace restore is not that namespace's to
		// delete.
		m, err := repo.Manifest(ctx, b.Status.BackupID)
		if errors.Is(err, backup.ErrNotFound) {
			return nil
		} else if err != nil {
			return fmt.Errorf("store %s: %w", store.Name, err)
		}
		if origin := m.Labels[storeref.ManifestNamespace]; origin == "" || origin != b.Namespace {
			return nil
		}
	}
	// An upload still running would write its manifest after the delete below. The agent
	// stops it once it sees the deletion; until its marker is gone, wait (a dead agent's
	// marker goes stale, which Running does not count).
	if running, err := repo.Running(ctx, b.Status.BackupID); err != nil {
		return fmt.Errorf("store %s: %w", store.Name, err)
	} else if running {
		return ipc.Deleting(fmt.Sprintf("waiting for the upload on node %s to stop before deleting backup %s from store %s", b.Status.Node, b.Status.BackupID, store.Name), backupPoll)
	}
	if err := repo.Delete(ctx, b.Status.BackupID); err != nil && !errors.Is(err, backup.ErrNotFound) {
		return fmt.Errorf("deleting backup %s from store %s: %w", b.Status.BackupID, store.Name, err)
	}
	return nil
}

// deleteOwnSnapshot deletes the VolumeSnapshot the backup took, and no other: one of the
// same name made by someone else is left alone (the UID precondition).
func (h *backupHandler) deleteOwnSnapshot(ctx context.Context, b *storagev1alpha1.VolumeBackup) error {
	var vs snapv1.VolumeSnapshot
	err := h.live.Get(ctx, client.ObjectKey{Namespace: b.Namespace, Name: b.Status.VolumeSnapshot}, &vs)
	if apierrors.IsNotFound(err) || (err == nil && !metav1.IsControlledBy(&vs, b)) {
		return nil
	}
	if err == nil {
		err = h.c.Delete(ctx, &vs, client.Preconditions{UID: &vs.UID})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting the backup's VolumeSnapshot %s: %w", b.Status.VolumeSnapshot, err)
	}
	return nil
}

// BackupSnapshotName is the VolumeSnapshot a backup of a PVC takes.
func BackupSnapshotName(backup string) string { return "backup-" + backup }

func completedMessage(b *storagev1alpha1.VolumeBackup) string {
	st := b.Status
	return fmt.Sprintf("backup of %s (%s) in store %s: %d bytes uploaded in %d objects", st.Volume, st.Size.String(), b.Spec.Store, st.BytesUploaded, st.ObjectsUploaded)
}

func percent(done int64, size *resource.Quantity) string {
	if size == nil || size.Value() == 0 {
		return "0%"
	}
	return fmt.Sprintf("%d%%", done*100/size.Value())
}

// backupProgressed passes what the uploading agent writes that changes the backup's
// verdict: the upload ending, or failing.
var backupProgressed = predicate.Funcs{
	CreateFunc: func(event.CreateEvent) bool { return false },
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*storagev1alpha1.VolumeBackup), e.ObjectNew.(*storagev1alpha1.VolumeBackup)
		return (o.Status.CompletionTime == nil) != (n.Status.CompletionTime == nil) || o.Status.UploadError != n.Status.UploadError
	},
	DeleteFunc:  func(event.DeleteEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

func backupToSelf(_ context.Context, o client.Object) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(o)}}
}
