package driver

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/replica"
)

// DeleteSnapshot implements csi.ControllerServer: every copy is deleted on its node, then
// the CStorVolumeSnapshot. A snapshot already gone is OK; a node that cannot be reached →
// Unavailable, nothing forgotten (the call is retried).
func (d *Driver) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id is required")
	}
	snap := &storagev1alpha1.CStorVolumeSnapshot{}
	err := d.c.Get(ctx, client.ObjectKey{Namespace: d.o.Namespace, Name: req.GetSnapshotId()}, snap)
	if apierrors.IsNotFound(err) {
		return &csi.DeleteSnapshotResponse{}, nil
	}
	if err != nil {
		return nil, apiError("reading snapshot", err)
	}
	if len(snap.Status.Copies) > 0 {
		if err := d.deleteCopies(ctx, snap); err != nil {
			return nil, err
		}
	}
	if err := d.c.Delete(ctx, snap); err != nil && !apierrors.IsNotFound(err) {
		return nil, apiError("deleting snapshot", err)
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

// deleteCopies deletes snap's copies on their replicas' nodes. A replica that is gone took
// its copy with it.
func (d *Driver) deleteCopies(ctx context.Context, snap *storagev1alpha1.CStorVolumeSnapshot) error {
	tlsConf, err := d.dataTLS(ctx)
	if err != nil {
		return status.Errorf(codes.Unavailable, "snapshot %s: the data path: %v", snap.Name, err)
	}
	var errs []error
	for _, c := range snap.Status.Copies {
		var r storagev1alpha1.CStorVolumeReplica
		if err := d.c.Get(ctx, client.ObjectKey{Namespace: snap.Namespace, Name: c.Replica}, &r); apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			errs = append(errs, fmt.Errorf("replica %s: %w", c.Replica, err))
			continue
		}
		if r.Status.Endpoint == "" {
			errs = append(errs, fmt.Errorf("replica %s on node %s has no data endpoint", c.Replica, c.Node))
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := replica.Dial(dctx, r.Status.Endpoint, tlsConf)
		if err == nil {
			err = conn.Replica(storagev1alpha1.ReplicaDataID(r.Namespace, r.Name)).DeleteSnapshot(dctx, string(snap.UID))
			conn.Close()
		}
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("replica %s on node %s: %w", c.Replica, c.Node, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return status.Errorf(codes.Unavailable, "deleting the copies of snapshot %s: %v", snap.Name, err)
	}
	return nil
}

// ListSnapshots implements csi.ControllerServer, in name order with the last name as the
// token, as ListVolumes.
func (d *Driver) ListSnapshots(ctx context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if req.GetMaxEntries() < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_entries must not be negative")
	}
	after, err := pageAfter(req.GetStartingToken())
	if err != nil {
		return nil, err
	}
	var l storagev1alpha1.CStorVolumeSnapshotList
	if err := d.c.List(ctx, &l, client.InNamespace(d.o.Namespace)); err != nil {
		return nil, apiError("listing snapshots", err)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Name < l.Items[j].Name })
	resp := &csi.ListSnapshotsResponse{}
	for i := range l.Items {
		snap := &l.Items[i]
		if snap.Name <= after || !snap.DeletionTimestamp.IsZero() ||
			(req.GetSnapshotId() != "" && snap.Name != req.GetSnapshotId()) ||
			(req.GetSourceVolumeId() != "" && snap.Spec.Volume != req.GetSourceVolumeId()) {
			continue
		}
		if req.GetMaxEntries() > 0 && len(resp.Entries) == int(req.GetMaxEntries()) {
			resp.NextToken = pageToken(resp.Entries[len(resp.Entries)-1].Snapshot.SnapshotId)
			break
		}
		s, err := csiSnapshot(snap)
		if err != nil {
			return nil, err
		}
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: s})
	}
	return resp, nil
}

// GetSnapshot implements csi.ControllerServer: the snapshot as ListSnapshots shows it.
func (d *Driver) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	if req.GetSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id is required")
	}
	snap := &storagev1alpha1.CStorVolumeSnapshot{}
	err := d.c.Get(ctx, client.ObjectKey{Namespace: d.o.Namespace, Name: req.GetSnapshotId()}, snap)
	if apierrors.IsNotFound(err) || (err == nil && !snap.DeletionTimestamp.IsZero()) {
		return nil, status.Errorf(codes.NotFound, "snapshot %s not found", req.GetSnapshotId())
	} else if err != nil {
		return nil, apiError("reading snapshot", err)
	}
	s, err := csiSnapshot(snap)
	if err != nil {
		return nil, err
	}
	return &csi.GetSnapshotResponse{Snapshot: s}, nil
}

// serveSnapshots takes the snapshots that are not ready of the volumes this node stages
// (their target runs here) or that are assigned to it (label LabelSnapshotNode: the volume
// is published here): the CreateSnapshot calls of the controller wait for them. It runs
// until ctx ends, watching, and lists again after a watch ends or fails.
func (d *Driver) serveSnapshots(ctx context.Context) {
	sel := client.MatchingLabels{}
	failed := false
	take := func(snap *storagev1alpha1.CStorVolumeSnapshot) {
		if snap.Status.ReadyToUse || !snap.DeletionTimestamp.IsZero() ||
			(d.stagedVolume(snap.Spec.Volume) == nil && snap.Labels[storagev1alpha1.LabelSnapshotNode] != d.o.NodeID) {
			return
		}
		if err := d.takeSnapshot(ctx, snap); err != nil && ctx.Err() == nil {
			failed = true
			d.log.Info("taking a snapshot failed; trying again", "snapshot", snap.Name, "error", err.Error())
		}
	}
	for ctx.Err() == nil {
		var l storagev1alpha1.CStorVolumeSnapshotList
		if err := d.c.List(ctx, &l, client.InNamespace(d.o.Namespace), sel); err != nil {
			d.log.Info("listing snapshots to take", "error", err.Error())
			sleepCtx(ctx, 2*time.Second)
			continue
		}
		failed = false
		for i := range l.Items {
			take(&l.Items[i])
		}
		w, err := d.c.Watch(ctx, &storagev1alpha1.CStorVolumeSnapshotList{}, client.InNamespace(d.o.Namespace), sel,
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: l.ResourceVersion}})
		if err != nil {
			sleepCtx(ctx, 2*time.Second)
			continue
		}
		// A failed take is tried again soon, by listing again; otherwise the list is only
		// a safety net under the watch.
		relist := 30 * time.Second
		if failed {
			relist = 2 * time.Second
		}
		retry := time.NewTimer(relist)
	events:
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					break events
				}
				if snap, ok := ev.Object.(*storagev1alpha1.CStorVolumeSnapshot); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
					take(snap)
				}
			case <-retry.C:
				break events
			case <-ctx.Done():
				break events
			}
		}
		retry.Stop()
		w.Stop()
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
