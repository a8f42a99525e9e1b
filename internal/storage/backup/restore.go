package backup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// RestoreOptions configure a restore.
type RestoreOptions struct {
	// Concurrency is how many chunks are downloaded and written at once; default 4.
	Concurrency int
	// WriteZeros writes the chunks of zeros too; without it they are skipped, for a
	// destination that reads as zeros where nothing was written (a new volume).
	WriteZeros bool
	// Progress, if set, is called after each chunk (never concurrently).
	Progress func(Progress)
	// Heartbeat is how often the restore tells Prune it still runs; as BackupOptions'.
	Heartbeat time.Duration
}

// Restore writes backup id to dst. Before writing anything it checks that every chunk the
// backup lists is in the store; a chunk that does not read back as its name says stops
// the restore with a *ChunkError naming it. dst then holds part of the backup: a restore
// into a new volume hands that volume to nobody until Restore has returned nil.
//
// While it runs, its marker (restoring/) keeps prunes from deleting what it reads.
func (r *Repository) Restore(ctx context.Context, id string, dst io.WriterAt, o RestoreOptions) (*Manifest, error) {
	sess, m, plan, err := r.openRestore(ctx, id, o.Heartbeat)
	if err != nil {
		return nil, err
	}
	defer sess.stop(ctx)
	if o.Concurrency <= 0 {
		o.Concurrency = 4
	}
	var (
		mu   sync.Mutex
		prog = Progress{Total: m.Size}
	)
	zero := make([]byte, m.ChunkSize)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(o.Concurrency)
	for i, name := range m.Chunks {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			off := int64(i) * int64(m.ChunkSize)
			n := min(int64(m.ChunkSize), m.Size-off)
			var data []byte
			if name == "" {
				if o.WriteZeros {
					data = zero[:n]
				}
			} else {
				plain, err := r.readChunk(gctx, name, plan[name])
				if err != nil {
					var ce *ChunkError
					if errors.As(err, &ce) {
						ce.Backups = []string{id}
					}
					return fmt.Errorf("restoring backup %s from %s: %w", id, r.store, err)
				}
				if int64(len(plain)) != n {
					return fmt.Errorf("restoring backup %s from %s: %w", id, r.store, &ChunkError{Chunk: name, Backups: []string{id},
						Err: fmt.Errorf("it holds %d bytes where the backup needs %d", len(plain), n)})
				}
				data = plain
			}
			if data != nil {
				if _, err := dst.WriteAt(data, off); err != nil {
					return fmt.Errorf("restoring backup %s: writing at %d: %w", id, off, err)
				}
			}
			mu.Lock()
			prog.Done += n
			if name != "" {
				prog.Uploaded++
				prog.UploadedBytes += n
			}
			if o.Progress != nil {
				o.Progress(prog)
			}
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return m, ctx.Err()
}

// openRestore registers a restore of backup id (its marker) and reads its manifest, then
// plans which copies of each chunk to read: first those the epoch the restore read neither
// condemns nor deletes, then those it condemns, then those found damaged; never those it
// deletes (its prune may be deleting them now). Like a backup's, the marker keeps every
// later prune from deleting a copy the restore may read, but those its epoch condemns: if a
// chunk has no other copy, the marker says an epoch older by one, which holds them too. A
// chunk without a copy to read is a *ChunkError, found before anything is read.
func (r *Repository) openRestore(ctx context.Context, id string, heartbeat time.Duration) (*session, *Manifest, map[string][]string, error) {
	if err := checkID(id); err != nil {
		return nil, nil, nil, err
	}
	if heartbeat <= 0 || heartbeat > r.pendingTimeout/4 {
		heartbeat = min(time.Minute, r.pendingTimeout/10)
	}
	for try := 0; ; try++ {
		sess, err := r.openSession(ctx, restoringPrefix+randomID(), id, heartbeat)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("restoring backup %s: %w", id, err)
		}
		m, plan, condemned, err := r.plan(ctx, id, sess.ep)
		if err != nil || !condemned {
			if err != nil {
				sess.stop(ctx)
			}
			return sess, m, plan, err
		}
		// The marker must say so before the next epoch is made.
		sess.mu.Lock()
		sess.m.Epoch--
		sess.mu.Unlock()
		err = sess.write(ctx)
		if err == nil {
			var seq int64
			seq, _, err = r.latestSeq(ctx)
			if err == nil && seq == sess.ep.Seq {
				return sess, m, plan, nil
			}
		}
		sess.stop(ctx)
		if err == nil && try >= 3 {
			err = errors.New("prunes keep making epochs")
		}
		if err != nil {
			return nil, nil, nil, fmt.Errorf("restoring backup %s: %w", id, err)
		}
	}
}

// errPruning: every copy of a chunk is one a prune may be deleting now.
var errPruning = errors.New("its only copies are being pruned (the backup that listed them was deleted, or they were condemned when it was made); try again after the pending timeout")

// plan says which copies to read of each chunk backup id lists, and whether one's first
// copy is one that ep condemns.
func (r *Repository) plan(ctx context.Context, id string, ep *epoch) (*Manifest, map[string][]string, bool, error) {
	m, err := r.Manifest(ctx, id)
	if err != nil {
		return nil, nil, false, err
	}
	list, err := r.storedChunks(ctx)
	if err != nil {
		return nil, nil, false, err
	}
	deleting, condemned := map[string]bool{}, map[string]bool{}
	for _, k := range ep.Deleting {
		deleting[k] = true
	}
	for _, k := range ep.Condemned {
		condemned[k] = true
	}
	needCondemned := false
	copies := list.byName()
	plan := map[string][]string{}
	for _, name := range m.Chunks {
		if name == "" || plan[name] != nil {
			continue
		}
		cs := copies[name]
		// Newest first: the copy most likely written whole by a backup running now.
		slices.SortFunc(cs, func(a, b chunkCopy) int { return cmp.Compare(b.Gen, a.Gen) })
		var good, doomed, damaged []string
		for _, c := range cs {
			switch {
			case deleting[c.Info.Key]:
			case list.damaged[c.Info.Key]:
				damaged = append(damaged, c.Info.Key)
			case condemned[c.Info.Key]:
				doomed = append(doomed, c.Info.Key)
			default:
				good = append(good, c.Info.Key)
			}
		}
		plan[name] = slices.Concat(good, doomed, damaged)
		if len(plan[name]) == 0 {
			err := ErrNotFound
			if len(cs) > 0 {
				err = errPruning
			}
			return nil, nil, false, fmt.Errorf("restoring backup %s from %s: %w", m.ID, r.store, &ChunkError{Chunk: name, Backups: []string{m.ID}, Err: err})
		}
		needCondemned = needCondemned || (len(good) == 0 && len(doomed) > 0)
	}
	return m, plan, needCondemned, nil
}
