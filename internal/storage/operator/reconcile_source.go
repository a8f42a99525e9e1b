package operator

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/ipc"
)

// snapshotPoll is how often a volume waiting for its source snapshot looks again.
const snapshotPoll = 2 * time.Second

// checkSource returns nil when vol's source snapshot can fill it (size bytes): it exists,
// is ready to use and is no larger. Otherwise the verdict: waiting for a snapshot that does
// not exist or is not ready yet, or invalid for one that is too large.
func (h *volumeHandler) checkSource(ctx context.Context, vol *storagev1alpha1.CStorVolume, size int64) (*ipc.Result, error) {
	name := vol.Spec.Source.Snapshot
	var snap storagev1alpha1.CStorVolumeSnapshot
	err := h.c.Get(ctx, client.ObjectKey{Namespace: vol.Namespace, Name: name}, &snap)
	switch {
	case apierrors.IsNotFound(err):
		res := ipc.Waiting(conditions.ReasonWaiting, fmt.Sprintf("waiting for snapshot %s, the volume's source, to exist", name), snapshotPoll)
		return &res, nil
	case err != nil:
		return nil, fmt.Errorf("reading snapshot %s: %w", name, err)
	case !snap.DeletionTimestamp.IsZero():
		return nil, ipc.InvalidSpec("snapshot %s, the volume's source, is being deleted", name)
	case !snap.Status.ReadyToUse || snap.Status.Size == nil || len(snap.Status.Copies) == 0:
		res := ipc.Waiting(conditions.ReasonWaiting, fmt.Sprintf("waiting for snapshot %s, the volume's source, to be ready to use", name), snapshotPoll)
		return &res, nil
	}
	if n, err := storagev1alpha1.Bytes(*snap.Status.Size); err != nil || n > size {
		return nil, ipc.InvalidSpec("snapshot %s is %s, larger than the volume (%s): a restore needs at least the snapshot's size", name, snap.Status.Size.String(), quantity(size))
	}
	return nil, nil
}
