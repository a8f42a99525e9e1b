package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/replica"
)

// dataState is what the data path says of a replica that exists on disk.
type dataState struct {
	rebuilding bool
	message    string
	// noSpace is the data service's report of a write that failed for a full file system.
	noSpace string
}

// reconcileData brings the data path's view of replica r into its status — the endpoint
// peers and targets dial, its revision, rebuild progress — and starts a rebuild when r is
// behind a clean peer while no target writes it: a replica placed on a new node, one whose
// node was away while the others took writes, or one a target left dirty. While a target
// writes it (a writer session is open) the target decides, since only it knows which
// writes each replica has acknowledged.
//
// A replica whose last write failed for lack of space is reported so while a target writes
// it (the target takes it back in once it can) or its pool is still full; with space back
// and no target, it is treated as any dirty replica and rebuilt from a clean peer.
func (h *replicaHandler) reconcileData(ctx context.Context, r *storagev1alpha1.CStorVolumeReplica, poolFull bool) (dataState, error) {
	d := h.data
	r.Status.Endpoint = d.endpoint
	id := storagev1alpha1.ReplicaDataID(r.Namespace, r.Name)
	self, err := d.client(ctx, d.endpoint, id)
	if err != nil {
		return dataState{}, fmt.Errorf("replica data service: %w", err)
	}
	info, err := self.Info(ctx)
	if err != nil {
		d.drop(d.endpoint)
		return dataState{}, fmt.Errorf("replica data service: %w", err)
	}
	r.Status.Revision = int64(info.Revision)
	if info.NoSpace != "" && (info.Session || poolFull) {
		return dataState{noSpace: info.NoSpace}, nil
	}
	if info.Rebuilding && (info.RebuildError == "" || info.Session) {
		return h.rebuilding(r, info), nil
	}
	if info.Rebuilding && r.Spec.Source != nil && !r.Status.SourceFilled && info.Revision == 0 {
		// A fill from the source failed: fill again (from any copy of a snapshot).
		if ds, filling, err := h.fillFromSource(ctx, self, r, info); err != nil || filling {
			return ds, err
		}
	}
	if info.Rebuilding {
		// The last copy failed (its source went away or changed) and no target is there to
		// start another: start one from the freshest peer, or report the failure. A dirty
		// peer is a source only while no target writes the volume: it may be the one written.
		source, sourceInfo, writing, _, err := h.freshestPeer(ctx, r)
		if err != nil || source == nil || (sourceInfo.Dirty && writing) {
			return h.rebuilding(r, info), err
		}
		if err := self.Rebuild(ctx, source.Status.Endpoint, storagev1alpha1.ReplicaDataID(source.Namespace, source.Name)); err != nil {
			return dataState{}, fmt.Errorf("restarting the rebuild from %s: %w", source.Name, err)
		}
		r.Status.Rebuild = &storagev1alpha1.ReplicaRebuild{Source: source.Name, Progress: "0%"}
		return dataState{rebuilding: true, message: fmt.Sprintf("rebuilding again from %s after: %s", source.Name, info.RebuildError)}, nil
	}
	r.Status.Rebuild = nil
	if info.Session {
		return dataState{}, nil // a target writes it: the target decides
	}
	if r.Spec.Source != nil && !r.Status.SourceFilled {
		// A restored replica is filled once. One that holds nothing yet (revision 0: no
		// write ever reached it, a target would have raised it) is filled now, losing
		// nothing; one with writes holds the snapshot's (a fill ends at its revision).
		if info.Revision == 0 {
			if ds, filling, err := h.fillFromSource(ctx, self, r, info); err != nil || filling {
				return ds, err
			}
		}
		r.Status.SourceFilled = true
	}
	// A replica falls behind its peers only while this agent is not serving it, or when a
	// target drops it (leaving it dirty): the peers are asked then, and for a new replica,
	// not on every resync.
	if !info.Dirty && h.data.current(r.UID) {
		return dataState{}, nil
	}
	source, sourceInfo, writing, unasked, err := h.freshestPeer(ctx, r)
	if err != nil {
		return dataState{}, err
	}
	if writing {
		// A target writes the volume without this replica (placed while the volume is in
		// use, or dropped by the target): it misses those writes until the target takes it
		// in and rebuilds it, which the target retries every few seconds.
		return dataState{rebuilding: true, message: "not in the write set of the volume's target yet: waiting for the target to take it in and rebuild it"}, nil
	}
	// A clean replica is current when no peer is ahead of it. A dirty one with no writer
	// (its target faulted it, or died) may hold writes the others never got, or miss some:
	// a clean peer, closed by a target that counted it healthy, is the truth; among dirty
	// ones only, the next target to open the volume settles which (the freshest, as here).
	// A clean replica behind a dirty peer copies it now: a new replica would otherwise
	// count as a copy of the volume while holding nothing until that next open.
	if source == nil || (!info.Dirty && sourceInfo.Revision <= info.Revision) || (info.Dirty && sourceInfo.Dirty) {
		if unasked != nil {
			// A Healthy peer that could not be asked may hold the writes: a replica just
			// placed on a new node is refused by its peers until the volume's status lists
			// that node. Calling it current would serve an empty file as the volume's data.
			return dataState{}, fmt.Errorf("cannot tell whether the replica is current: %w", unasked)
		}
		h.data.setCurrent(r.UID)
		return dataState{}, nil
	}
	if err := self.Rebuild(ctx, source.Status.Endpoint, storagev1alpha1.ReplicaDataID(source.Namespace, source.Name)); err != nil {
		return dataState{}, fmt.Errorf("starting a rebuild from %s: %w", source.Name, err)
	}
	r.Status.Rebuild = &storagev1alpha1.ReplicaRebuild{Source: source.Name, Progress: "0%"}
	msg := fmt.Sprintf("rebuilding from %s (revision %d, this replica %d)", source.Name, sourceInfo.Revision, info.Revision)
	if sourceInfo.Dirty {
		msg += "; the source is dirty (its target did not close it), the freshest left"
	}
	return dataState{rebuilding: true, message: msg}, nil
}

// rebuilding reports a rebuild in progress in r's status.
func (h *replicaHandler) rebuilding(r *storagev1alpha1.CStorVolumeReplica, info replica.Info) dataState {
	rb := r.Status.Rebuild
	if rb == nil {
		rb = &storagev1alpha1.ReplicaRebuild{} // started by the volume's target
	}
	rb.DoneBytes, rb.TotalBytes, rb.Error = info.RebuildDone, info.RebuildTotal, info.RebuildError
	rb.Progress = "0%"
	if info.RebuildTotal > 0 {
		rb.Progress = fmt.Sprintf("%d%%", min(100, info.RebuildDone*100/info.RebuildTotal))
	}
	r.Status.Rebuild = rb
	msg := fmt.Sprintf("rebuilding: %s of %d bytes copied", rb.Progress, info.RebuildTotal)
	if rb.Source != "" {
		msg = fmt.Sprintf("rebuilding from %s: %s of %d bytes copied", rb.Source, rb.Progress, info.RebuildTotal)
	}
	if info.RebuildError != "" {
		msg += "; last attempt failed: " + info.RebuildError
	}
	return dataState{rebuilding: true, message: msg}
}

// freshestPeer returns the Healthy peer replica of r's volume that holds the most writes
// (a clean one on a tie, replica.ChooseSource); nil when there is none. writing says that a
// target has a peer open for writing. unasked says which Healthy peers could not be asked
// (unreachable, or refusing this node), nil when all were.
func (h *replicaHandler) freshestPeer(ctx context.Context, r *storagev1alpha1.CStorVolumeReplica) (_ *storagev1alpha1.CStorVolumeReplica, _ replica.Info, writing bool, unasked, _ error) {
	// The agent's cache holds only its node's replicas: peers come from the API server.
	var list storagev1alpha1.CStorVolumeReplicaList
	if err := h.live.List(ctx, &list, client.InNamespace(r.Namespace), client.MatchingFields{storagev1alpha1.FieldVolume: r.Spec.Volume}); err != nil {
		return nil, replica.Info{}, false, nil, fmt.Errorf("listing the replicas of volume %s: %w", r.Spec.Volume, err)
	}
	var (
		peers []*storagev1alpha1.CStorVolumeReplica
		infos []replica.Info
		vol   *storagev1alpha1.CStorVolume // read once a peer cannot be asked
	)
	for i := range list.Items {
		p := &list.Items[i]
		if p.Name == r.Name || p.Status.Phase != storagev1alpha1.ReplicaPhaseHealthy || p.Status.Endpoint == "" || !p.DeletionTimestamp.IsZero() {
			continue
		}
		var info replica.Info
		c, err := h.data.client(ctx, p.Status.Endpoint, storagev1alpha1.ReplicaDataID(p.Namespace, p.Name))
		if err == nil {
			if info, err = c.Info(ctx); err != nil && !errors.Is(err, replica.ErrForbidden) {
				h.data.drop(p.Status.Endpoint)
			}
		}
		if err != nil {
			// An unreachable peer is no source, but it may hold what the others lack,
			// unless the operator counts it Offline (its node is down: it will be replaced).
			if vol == nil {
				vol = &storagev1alpha1.CStorVolume{}
				if gerr := h.live.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: r.Spec.Volume}, vol); gerr != nil {
					return nil, replica.Info{}, false, nil, fmt.Errorf("volume %s: %w", r.Spec.Volume, gerr)
				}
			}
			if !slices.ContainsFunc(vol.Status.Replicas, func(s storagev1alpha1.VolumeReplicaStatus) bool {
				return s.Name == p.Name && s.Phase != storagev1alpha1.ReplicaPhaseHealthy
			}) {
				unasked = errors.Join(unasked, fmt.Errorf("peer %s on node %s: %w", p.Name, p.Spec.NodeName, err))
			}
			continue
		}
		peers, infos = append(peers, p), append(infos, info)
		writing = writing || info.Session
	}
	i, ok := replica.ChooseSource(infos)
	if !ok {
		return nil, replica.Info{}, writing, unasked, nil
	}
	return peers[i], infos[i], writing, unasked, nil
}

// fillFromSource starts filling replica r from its source: a snapshot or a backup.
func (h *replicaHandler) fillFromSource(ctx context.Context, self *replica.Client, r *storagev1alpha1.CStorVolumeReplica, info replica.Info) (dataState, bool, error) {
	if r.Spec.Source.Backup != nil {
		return h.fillFromBackup(ctx, r, info.RebuildError)
	}
	return h.fillFromSnapshot(ctx, self, r)
}

// fillFromSnapshot starts filling replica r (self, on this node) from a copy of its source
// snapshot on any node that holds one. filling is false when there is nothing to copy (the
// snapshot's volume was never written): r is then as current as any peer.
func (h *replicaHandler) fillFromSnapshot(ctx context.Context, self *replica.Client, r *storagev1alpha1.CStorVolumeReplica) (_ dataState, filling bool, _ error) {
	name := r.Spec.Source.Snapshot
	var snap storagev1alpha1.CStorVolumeSnapshot
	if err := h.live.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, &snap); err != nil {
		// The operator placed r only once the snapshot was ready; without it, r stays
		// unfilled and says so rather than passing for a restored replica.
		return dataState{rebuilding: true, message: fmt.Sprintf("cannot read snapshot %s to fill the replica from: %v", name, err)}, true, nil
	}
	var tried []string
	for _, c := range snap.Status.Copies {
		var holder storagev1alpha1.CStorVolumeReplica
		if err := h.live.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: c.Replica}, &holder); err != nil {
			tried = append(tried, fmt.Sprintf("%s: %v", c.Replica, err))
			continue
		}
		if holder.Status.Endpoint == "" {
			tried = append(tried, c.Replica+": no data endpoint")
			continue
		}
		id := storagev1alpha1.SnapshotDataID(r.Namespace, c.Replica, string(snap.UID))
		src, err := h.data.client(ctx, holder.Status.Endpoint, id)
		if err != nil {
			tried = append(tried, fmt.Sprintf("%s: %v", c.Replica, err))
			continue
		}
		info, err := src.Info(ctx)
		if err != nil {
			h.data.drop(holder.Status.Endpoint)
			tried = append(tried, fmt.Sprintf("%s: %v", c.Replica, err))
			continue
		}
		if info.Revision == 0 {
			return dataState{}, false, nil
		}
		if err := self.Rebuild(ctx, holder.Status.Endpoint, id); err != nil {
			return dataState{}, false, fmt.Errorf("filling from snapshot %s on %s: %w", name, c.Replica, err)
		}
		r.Status.Rebuild = &storagev1alpha1.ReplicaRebuild{Source: "snapshot " + name + " on " + c.Replica, Progress: "0%"}
		return dataState{rebuilding: true, message: fmt.Sprintf("filling from snapshot %s (the copy on %s, revision %d)", name, c.Replica, info.Revision)}, true, nil
	}
	return dataState{rebuilding: true, message: fmt.Sprintf("no copy of snapshot %s reachable to fill the replica from: %s", name, strings.Join(tried, "; "))}, true, nil
}
