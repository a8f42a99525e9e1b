package target

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/crdipc/crdipc/internal/storage/replica"
)

// maxSnapshotWait bounds how long a snapshot holds writes back waiting for the replicas'
// copies, whatever the caller's context allows.
const maxSnapshotWait = 5 * time.Minute

// SnapshotInfo describes a snapshot of the volume.
type SnapshotInfo struct {
	// Size is the snapshot's size in bytes (the volume's when it was taken).
	Size int64
	// Revision is the highest revision the snapshot holds.
	Revision uint64
	// Replicas are the ids of the members holding a copy; each copy is served read-only as
	// replica.SnapshotID(id, name) for a rebuild to restore from.
	Replicas []string
	// Time is when it was taken.
	Time time.Time
}

// Snapshot takes snapshot name of the volume, crash-consistent: it stops admitting writes
// and waits for those in flight (reads go on), flushes every healthy replica, has each of
// them copy its data (replica.Client.Snapshot), and resumes writes, on error too. Every
// write acknowledged before the call is in the snapshot and no copy holds a write the
// others lack. Rebuilding replicas are not asked, since their data is incomplete.
//
// It succeeds when at least ConsistencyFactor replicas took it. A replica whose snapshot
// failed is named in the error (or the log, on success); it is faulted only when the call
// failed as a write would (the connection broke, or the flush failed). When fewer succeed,
// the copies made are deleted again, so that a retry starts afresh.
//
// Repeating the call for a name that exists returns it as it is. Should some replicas hold
// it from an earlier call and others not, the copies made now (of a later moment) are
// deleted and the earlier ones returned, if ConsistencyFactor of them remain; otherwise
// the call fails and the snapshot must be deleted before it can be taken again. ctx bounds
// the wait (at most maxSnapshotWait), during which writes wait too.
func (e *Engine) Snapshot(ctx context.Context, name string) (SnapshotInfo, error) {
	if err := replica.ValidateSnapshotName(name); err != nil {
		return SnapshotInfo{}, err
	}
	e.snapMu.Lock()
	defer e.snapMu.Unlock()
	e.growMu.Lock() // the size stays as the snapshot reports it
	defer e.growMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, maxSnapshotWait)
	defer cancel()

	// Writes take the barrier shared for each fan-out: holding it exclusively, no write is
	// half applied, and every healthy replica holds the same data.
	e.barrier.Lock()
	defer e.barrier.Unlock()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return SnapshotInfo{}, ErrClosed
	}
	var set []dest
	for _, m := range e.order {
		if m.state == Healthy {
			set = append(set, dest{m: m, r: m.r, gen: m.gen, healthy: true})
		}
	}
	e.mu.Unlock()
	if len(set) < e.cf {
		return SnapshotInfo{}, fmt.Errorf("%w: snapshot %s: %d healthy replicas, %d needed", ErrNoQuorum, name, len(set), e.cf)
	}

	ferrs, ok, failures, _ := e.onEach(set, "flush", func(ctx context.Context, r Replica) error { return r.Flush(ctx) })
	if ok < e.cf {
		return SnapshotInfo{}, fmt.Errorf("%w: snapshot %s: flush succeeded on %d healthy replicas, %d needed: %w",
			ErrNoQuorum, name, ok, e.cf, errors.Join(failures...))
	}
	var flushed []dest
	for i, t := range set {
		if ferrs[i] == nil {
			flushed = append(flushed, t)
		}
	}

	infos, errs := make([]replica.SnapshotInfo, len(flushed)), make([]error, len(flushed))
	var wg sync.WaitGroup
	for i, t := range flushed {
		wg.Add(1)
		go func() {
			defer wg.Done()
			infos[i], errs[i] = t.r.Snapshot(ctx, name)
		}()
	}
	wg.Wait()
	var existing, created []int
	failures = nil
	for i, t := range flushed {
		switch err := errs[i]; {
		case err == nil && infos[i].Created:
			created = append(created, i)
		case err == nil:
			existing = append(existing, i)
		default:
			err = fmt.Errorf("replica %s: snapshot: %w", t.m.ID, err)
			failures = append(failures, err)
			var remote *replica.RemoteError
			if !errors.As(err, &remote) && ctx.Err() == nil {
				// Not the replica refusing: the connection failed, as a write's would.
				e.fault(t.m, t.gen, err)
			}
		}
	}
	// Copies from an earlier call are of an earlier moment than those made now: a name
	// must not stand for two different contents, so the earlier ones win.
	keep, drop := slices.Concat(existing, created), []int(nil)
	if len(existing) > 0 && len(created) > 0 {
		keep, drop = existing, created
		e.log.Warn("snapshot existed on some replicas only; deleting the copies made now", "snapshot", name,
			"existing", len(existing), "created", len(created))
	}
	if len(keep) < e.cf {
		if len(existing) == 0 {
			drop = created
		}
		e.dropSnapshots(name, flushed, drop)
		err := fmt.Errorf("%w: snapshot %s taken on %d healthy replicas, %d needed", ErrNoQuorum, name, len(keep), e.cf)
		if len(existing) > 0 {
			err = fmt.Errorf("%w (%d hold it from an earlier call: delete the snapshot to take it again)", err, len(existing))
		}
		if len(failures) > 0 {
			err = fmt.Errorf("%w: %w", err, errors.Join(failures...))
		}
		return SnapshotInfo{}, err
	}
	e.dropSnapshots(name, flushed, drop)

	out := SnapshotInfo{}
	for _, i := range keep {
		in := infos[i]
		out.Replicas = append(out.Replicas, flushed[i].m.ID)
		out.Size = max(out.Size, in.Size)
		out.Revision = max(out.Revision, in.Revision)
		if out.Time.IsZero() || in.Time.Before(out.Time) {
			out.Time = in.Time
		}
	}
	if len(failures) > 0 {
		e.log.Warn("snapshot taken without some replicas", "snapshot", name, "err", errors.Join(failures...))
	}
	e.log.Info("snapshot taken", "snapshot", name, "replicas", out.Replicas, "revision", out.Revision, "created", len(created) > 0 && len(drop) == 0)
	return out, nil
}

// dropSnapshots deletes snapshot name on the replicas set[i] for i in idx, logging what fails.
func (e *Engine) dropSnapshots(name string, set []dest, idx []int) {
	for _, i := range idx {
		ctx, cancel := context.WithTimeout(e.ioCtx, e.ioTimeout)
		if err := set[i].r.DeleteSnapshot(ctx, name); err != nil {
			e.log.Warn("deleting a snapshot copy failed", "snapshot", name, "replica", set[i].m.ID, "err", err)
		}
		cancel()
	}
}

// DeleteSnapshot deletes snapshot name on every member, whatever its state (faulted ones
// are dialled for it); a member without it counts as done. It tries every member and
// returns an error naming those it could not reach, so that the caller tries again.
func (e *Engine) DeleteSnapshot(ctx context.Context, name string) error {
	if err := replica.ValidateSnapshotName(name); err != nil {
		return err
	}
	e.snapMu.Lock()
	defer e.snapMu.Unlock()
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	type target struct {
		m *member
		r Replica
	}
	var ts []target
	for _, m := range e.order {
		ts = append(ts, target{m, m.r})
	}
	e.mu.Unlock()
	errs := make([]error, len(ts))
	var wg sync.WaitGroup
	for i, t := range ts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := t.r
			if r == nil {
				var err error
				if r, err = e.dial(ctx, t.m); err != nil {
					errs[i] = fmt.Errorf("replica %s: delete snapshot %s: %w", t.m.ID, name, err)
					return
				}
				defer e.closeHandle(t.m, r)
			}
			cctx, cancel := context.WithTimeout(ctx, e.ioTimeout)
			defer cancel()
			if err := r.DeleteSnapshot(cctx, name); err != nil {
				errs[i] = fmt.Errorf("replica %s: delete snapshot %s: %w", t.m.ID, name, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	e.log.Info("snapshot deleted", "snapshot", name)
	return nil
}
