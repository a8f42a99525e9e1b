package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// defaultPendingTimeout: a backup or restore whose marker was not renewed for this long is
// taken for dead (the default and the most a store may set; see InitOptions).
const defaultPendingTimeout = 10 * time.Minute

// PruneOptions configure Prune.
type PruneOptions struct{}

// PruneResult is what a Prune did.
type PruneResult struct {
	// Epoch is the epoch this prune made; 0 if it made none: the newest is younger than
	// the pending timeout (NotBefore says when the next may be made), or another prune
	// made it first.
	Epoch     int64
	NotBefore time.Time
	// Deleted chunk copies (and their stored bytes) were condemned by the previous epoch
	// and still listed by no backup.
	Deleted      int
	DeletedBytes int64
	// Condemned copies are listed by no backup now: the next epoch deletes them, unless a
	// backup lists them by then.
	Condemned int
	// Waiting are the backups (IDs) and restores (restore:<ID>) running with an older
	// epoch than the one whose condemned chunks this prune would delete: it deleted none,
	// and made no epoch (unless they started while it made one).
	Waiting []string
	// Stopped: the prune ran out of its time (half the pending timeout) before every
	// deletion; the rest are condemned again.
	Stopped bool
}

// Prune deletes the chunk copies that no backup lists, without ever deleting one that a
// backup's manifest, a running backup or a running restore needs. Each Prune that finds the
// newest epoch at least the pending timeout old makes the next one (docs/backup.md, "Backing
// up while a prune runs"):
//
//  1. It lists the running backups' and restores' markers. If one read an epoch older than n
//     (and so may reuse a copy epoch n condemned), it stops.
//  2. It lists the manifests and the chunk copies. Those of epoch n's condemned copies that no
//     manifest lists are to be deleted; every other copy that no manifest lists is condemned.
//  3. It writes epoch n+1 (deleting, condemned) once, if no prune did: two prunes never
//     decide the same epoch.
//  4. It lists the markers again, as in 1, and stops if it finds one: the copies stay, and
//     are condemned again.
//  5. It lists the manifests again and deletes the copies still listed by none, within half
//     the pending timeout of step 3.
//
// A backup that read epoch m reuses no copy that epoch m condemns or deletes, and writes
// only copies of its own epoch, named <chunk>.<m>: none of them existed when an epoch was
// decided that could delete it.
func (r *Repository) Prune(ctx context.Context, _ PruneOptions) (*PruneResult, error) {
	res := &PruneResult{}
	prev, err := r.latestEpoch(ctx)
	if err != nil {
		return nil, err
	}
	if prev.Seq > 0 {
		// One epoch per pending timeout: the previous prune's deletions are over (it stops
		// after half of it) before a backup may read a newer epoch, which does not name them.
		now, err := r.storeClock(ctx)
		if err != nil {
			return nil, err
		}
		if next := prev.created.Add(r.pendingTimeout); now.Before(next) {
			res.NotBefore = next
			return res, nil
		}
	}
	// Nothing of what epoch prev condemned may be deleted while a backup that read an older
	// epoch runs: then no epoch is made either, so that backups that start meanwhile read
	// prev, and its chunks go once the older ones ended.
	if len(prev.Condemned) > 0 {
		if res.Waiting, err = r.waiting(ctx, prev.Seq); err != nil || len(res.Waiting) > 0 {
			return res, err
		}
	}
	listed, err := r.listed(ctx)
	if err != nil {
		return nil, err
	}
	list, err := r.storedChunks(ctx)
	if err != nil {
		return nil, err
	}
	next := epoch{Seq: prev.Seq + 1}
	deleting := map[string]bool{}
	for _, key := range prev.Condemned {
		if c, ok := list.copies[key]; ok && !listed[c.Name] {
			next.Deleting = append(next.Deleting, key)
			deleting[key] = true
		}
	}
	for key, c := range list.copies {
		if !listed[c.Name] && !deleting[key] {
			next.Condemned = append(next.Condemned, key)
		}
	}
	slices.Sort(next.Condemned)
	data, err := json.Marshal(next)
	if err != nil {
		return nil, err
	}
	began := r.now()
	if err := r.store.Create(ctx, epochKey(next.Seq), data); errors.Is(err, ErrExists) {
		return res, nil
	} else if err != nil {
		return nil, fmt.Errorf("pruning %s: writing %s: %w", r.store, epochKey(next.Seq), err)
	}
	res.Epoch, res.Condemned = next.Seq, len(next.Condemned)
	// Epochs older than the previous one are read by nobody who reads the newest.
	for seq := prev.Seq - 1; seq > 0 && seq >= prev.Seq-3; seq-- {
		_ = r.store.Delete(ctx, epochKey(seq))
	}
	r.dropDamageRecords(ctx, list)
	if len(next.Deleting) == 0 {
		return res, nil
	}

	// Again, now that the epoch is written: a backup that started since read it.
	if res.Waiting, err = r.waiting(ctx, prev.Seq); err != nil || len(res.Waiting) > 0 {
		return res, err
	}
	// A backup of an older epoch that ended before the markers were listed wrote its
	// manifest by then.
	if listed, err = r.listed(ctx); err != nil {
		return nil, err
	}
	// No deletion may land after half the pending timeout: a prune that makes the next
	// epoch no longer names these copies.
	dctx, cancel := context.WithDeadline(ctx, began.Add(r.pendingTimeout/2))
	defer cancel()
	for _, key := range next.Deleting {
		c := list.copies[key]
		if listed[c.Name] {
			continue
		}
		if r.now().Sub(began) > r.pendingTimeout/2 {
			res.Stopped = true
			break
		}
		if err := r.store.Delete(dctx, key); err != nil {
			if dctx.Err() != nil && ctx.Err() == nil {
				res.Stopped = true
				break
			}
			return nil, fmt.Errorf("pruning %s: %w", r.store, err)
		}
		res.Deleted++
		res.DeletedBytes += c.Info.Size
	}
	return res, nil
}

// waiting lists the running backups and restores that read an epoch older than seq (a
// restore that reads copies the epoch it read condemns says one older).
func (r *Repository) waiting(ctx context.Context, seq int64) ([]string, error) {
	var out []string
	backups, err := r.liveMarkers(ctx, pendingPrefix)
	if err != nil {
		return nil, err
	}
	for _, m := range backups {
		if m.Epoch < seq {
			out = append(out, m.ID)
		}
	}
	restores, err := r.liveMarkers(ctx, restoringPrefix)
	if err != nil {
		return nil, err
	}
	for _, m := range restores {
		if m.Epoch < seq {
			out = append(out, "restore:"+m.ID)
		}
	}
	return out, nil
}

// dropDamageRecords deletes the records of damaged copies that are no longer stored.
func (r *Repository) dropDamageRecords(ctx context.Context, list *chunkList) {
	for key := range list.damaged {
		if _, ok := list.copies[key]; !ok {
			_ = r.store.Delete(ctx, damagedKey(key))
		}
	}
}

// listed is the set of chunks some backup lists.
func (r *Repository) listed(ctx context.Context) (map[string]bool, error) {
	backups, err := r.Backups(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, m := range backups {
		for _, c := range m.Chunks {
			if c != "" {
				out[c] = true
			}
		}
	}
	return out, nil
}
