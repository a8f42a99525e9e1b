package operator

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/ipc"
)

// checkSource returns nil when vol's source snapshot can fill it (size bytes): it exists,
// is ready to use and is no larger. Otherwise the verdict: waiting for a snapshot that does
// not exist or is not ready yet, or invalid for one that is too large.
func (h *volumeHandler) checkSource(ctx context.Context, vol *storagev1alpha1.CStorVolume, size int64) (*ipc.Result, error) {
	if b := vol.Spec.Source.Backup; b != nil {
		return h.checkBackupSource(ctx, b)
	}
	name := vol.Spec.Source.Snapshot
	var snap storagev1alpha1.CStorVolumeSnapshot
	err := h.c.Get(ctx, client.ObjectKey{Namespace: vol.Namespace, Name: name}, &snap)
	switch {
	case apierrors.IsNotFound(err):
		res := ipc.Waiting(conditions.ReasonWaiting, fmt.Sprintf("waiting for snapshot %s, the volume's source, to exist", name), 0)
		return &res, nil
	case err != nil:
		return nil, fmt.Errorf("reading snapshot %s: %w", name, err)
	case !snap.DeletionTimestamp.IsZero():
		return nil, ipc.InvalidSpec("snapshot %s, the volume's source, is being deleted", name)
	case !snap.Status.ReadyToUse || snap.Status.Size == nil || len(snap.Status.Copies) == 0:
		res := ipc.Waiting(conditions.ReasonWaiting, fmt.Sprintf("waiting for snapshot %s, the volume's source, to be ready to use", name), 0)
		return &res, nil
	}
	if n, err := storagev1alpha1.Bytes(*snap.Status.Size); err != nil || n > size {
		return nil, ipc.InvalidSpec("snapshot %s is %s, larger than the volume (%s): a restore needs at least the snapshot's size", name, snap.Status.Size.String(), quantity(size))
	}
	return nil, nil
}

// checkBackupSource waits for the store of a volume's source backup to open. That the backup
// is in it, whole and no larger than the volume, each replica's agent finds out as it fills
// the replica, and says so in the replica's status.
func (h *volumeHandler) checkBackupSource(ctx context.Context, b *storagev1alpha1.BackupRef) (*ipc.Result, error) {
	var store storagev1alpha1.BackupStore
	err := h.c.Get(ctx, client.ObjectKey{Name: b.Store}, &store)
	if apierrors.IsNotFound(err) {
		res := ipc.Waiting(conditions.ReasonWaiting, fmt.Sprintf("waiting for backup store %s, which holds the volume's source backup %s, to exist", b.Store, b.ID), 30*time.Second)
		return &res, nil
	} else if err != nil {
		return nil, fmt.Errorf("reading backup store %s: %w", b.Store, err)
	}
	if c := meta.FindStatusCondition(store.Status.Conditions, conditions.TypeReady); c == nil || c.Status != metav1.ConditionTrue {
		res := ipc.Waiting(conditions.ReasonWaiting, fmt.Sprintf("waiting for backup store %s, which holds the volume's source backup %s, to be ready", b.Store, b.ID), 10*time.Second)
		return &res, nil
	}
	return nil, nil
}

// snapshotToVolumes maps a snapshot change to the volumes of its namespace that it is the
// source of, not yet placed: a volume waiting for its snapshot to exist or be ready to use
// is called again then (no polling).
func (h *volumeHandler) snapshotToVolumes(ctx context.Context, o client.Object) []reconcile.Request {
	return h.volumesWhere(ctx, func(v *storagev1alpha1.CStorVolume) bool {
		return v.Namespace == o.GetNamespace() && v.Spec.Source != nil && v.Spec.Source.Snapshot == o.GetName() &&
			len(v.Status.Replicas) == 0 && v.DeletionTimestamp.IsZero()
	})
}

// snapshotChanged passes snapshots appearing, going, and changing what a restore waits on.
var snapshotChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld.(*storagev1alpha1.CStorVolumeSnapshot), e.ObjectNew.(*storagev1alpha1.CStorVolumeSnapshot)
		return o.Status.ReadyToUse != n.Status.ReadyToUse || len(o.Status.Copies) != len(n.Status.Copies) ||
			(o.Status.Size == nil) != (n.Status.Size == nil) || o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero()
	},
}
