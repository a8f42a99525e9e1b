package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/replica"
)

// dropOrphanSnapshots deletes the snapshot copies kept beside r's data whose
// CStorVolumeSnapshot is gone: one deleted directly (kubectl delete) rather than through the
// CSI driver's DeleteSnapshot, which deletes the copies first. Without this they would
// hold pool space until the replica went. A copy is named after its snapshot's UID and is
// taken only once the snapshot exists, so a copy whose UID no snapshot in r's namespace has
// is an orphan; the snapshots are read from the API server itself, never from a cache that
// may not have seen one just created.
func (h *replicaHandler) dropOrphanSnapshots(ctx context.Context, self *replica.Client, r *storagev1alpha1.CStorVolumeReplica) error {
	if r.Status.Location == "" {
		return nil
	}
	names, err := replica.SnapshotNames(r.Status.Location)
	if errors.Is(err, fs.ErrNotExist) || len(names) == 0 {
		return nil // a backend that keeps no snapshots beside a file (zfs), or none taken
	}
	if err != nil {
		return err
	}
	var snaps storagev1alpha1.CStorVolumeSnapshotList
	if err := h.live.List(ctx, &snaps, client.InNamespace(r.Namespace)); err != nil {
		return fmt.Errorf("listing snapshots: %w", err)
	}
	exists := make(map[string]bool, len(snaps.Items))
	for _, s := range snaps.Items {
		exists[string(s.UID)] = true
	}
	var errs []error
	for _, name := range names {
		if exists[name] {
			continue
		}
		if err := self.DeleteSnapshot(ctx, name); err != nil {
			errs = append(errs, fmt.Errorf("deleting the copy of snapshot %s, which no longer exists: %w", name, err))
			continue
		}
		log.FromContext(ctx).Info("deleted the copy of a snapshot that no longer exists", "replica", r.Name, "snapshot", name)
	}
	return errors.Join(errs...)
}
