package agent

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/backup"
	"github.com/crdipc/crdipc/internal/storage/replica"
	"github.com/crdipc/crdipc/internal/storage/storeref"
)

// fillFromBackup starts filling replica r, on this node, from its source backup: the agent
// reads the backup's chunks from the store and decrypts them here, next to the replica, as a
// rebuild (progress, durability and failures as any). Every replica of a restored volume is
// filled so, from the store, in parallel: none waits for another. lastErr is the failure of
// the previous attempt, if any, which the message keeps until this one is done.
func (h *replicaHandler) fillFromBackup(ctx context.Context, r *storagev1alpha1.CStorVolumeReplica, lastErr string) (dataState, bool, error) {
	ref := r.Spec.Source.Backup
	waiting := func(format string, a ...any) (dataState, bool, error) {
		return dataState{rebuilding: true, message: fmt.Sprintf(format, a...)}, true, nil
	}
	var store storagev1alpha1.BackupStore
	if err := h.live.Get(ctx, client.ObjectKey{Name: ref.Store}, &store); err != nil {
		return waiting("cannot read backup store %s to fill the replica from: %v", ref.Store, err)
	}
	repo, err := storeref.Open(ctx, h.live, &store, false)
	if err != nil {
		return waiting("cannot open backup store %s to fill the replica from: %v", ref.Store, err)
	}
	rd, err := repo.Reader(ctx, ref.ID)
	if err != nil {
		return waiting("cannot fill the replica from backup %s: %v", ref.ID, err)
	}
	if size, err := storagev1alpha1.Bytes(r.Spec.Capacity); err == nil && rd.Manifest().Size > size {
		rd.Close()
		return waiting("backup %s holds %d bytes, more than the replica's %d: restore it into a claim at least that large", ref.ID, rd.Manifest().Size, size)
	}
	name := fmt.Sprintf("backup %s in store %s", ref.ID, ref.Store)
	// The reader holds a restore's marker in the store, which keeps prunes from deleting
	// its chunks; the fill closes it when it stops reading.
	if err := h.data.fill(storagev1alpha1.ReplicaDataID(r.Namespace, r.Name), name, backupSource{rd}); err != nil {
		rd.Close()
		return dataState{}, false, fmt.Errorf("filling from %s: %w", name, err)
	}
	r.Status.Rebuild = &storagev1alpha1.ReplicaRebuild{Source: name, Progress: "0%"}
	msg := "filling from " + name
	if lastErr != "" {
		msg += "; the last attempt failed: " + lastErr
	}
	return dataState{rebuilding: true, message: msg}, true, nil
}

// backupSource is a backup as a replica.Source. Its revision is 1: what a replica filled
// from it holds, as every other replica of the volume filled from it.
type backupSource struct{ r *backup.Reader }

func (s backupSource) Info(context.Context) (replica.Info, error) {
	m := s.r.Manifest()
	return replica.Info{ID: "backup " + m.ID, Size: m.Size, Revision: 1}, nil
}

func (s backupSource) Extents(_ context.Context, off, length int64) ([]replica.Extent, error) {
	var out []replica.Extent
	for _, e := range s.r.Extents(off, length) {
		out = append(out, replica.Extent{Offset: e.Offset, Length: e.Length})
	}
	return out, nil
}

func (s backupSource) ReadAt(ctx context.Context, p []byte, off int64) error {
	return s.r.ReadAt(ctx, p, off)
}

// Close ends the restore's marker (replica.Fill calls it when the fill stops).
func (s backupSource) Close() error { return s.r.Close() }
