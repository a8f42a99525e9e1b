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
// While it runs, its marker (restoring/) keeps every prune from deleting anything.
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
// plans which copies of each chunk to read: not those the epoch the restore read deletes (its
// prune may be deleting them now: no later prune deletes anything while the marker is
// fresh), and those found damaged last. A chunk without a copy to read is a *ChunkError,
// found before anything is read.
func (r *Repository) openRestore(ctx context.Context, id string, heartbeat time.Duration) (*session, *Manifest, map[string][]string, error) {
	if err := checkID(id); err != nil {
		return nil, nil, nil, err
	}
	if heartbeat <= 0 || heartbeat > r.pendingTimeout/4 {
		heartbeat = min(time.Minute, r.pendingTimeout/10)
	}
	sess, err := r.openSession(ctx, restoringPrefix+randomID(), id, heartbeat)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("restoring backup %s: %w", id, err)
	}
	m, plan, err := r.plan(ctx, id, sess.ep)
	if err != nil {
		sess.stop(ctx)
		return nil, nil, nil, err
	}
	return sess, m, plan, nil
}

// errPruning: every copy of a chunk is one a prune may be deleting now.
var errPruning = errors.New("its only copies are being pruned (the backup that listed them was deleted, or they were condemned when it was made); try again after the pending timeout")

func (r *Repository) plan(ctx context.Context, id string, ep *epoch) (*Manifest, map[string][]string, error) {
	m, err := r.Manifest(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	list, err := r.storedChunks(ctx)
	if err != nil {
		return nil, nil, err
	}
	deleting := map[string]bool{}
	for _, k := range ep.Deleting {
		deleting[k] = true
	}
	copies := list.byName()
	plan := map[string][]string{}
	for _, name := range m.Chunks {
		if name == "" || plan[name] != nil {
			continue
		}
		cs := copies[name]
		// Newest first: the copy most likely written whole by a backup running now.
		slices.SortFunc(cs, func(a, b chunkCopy) int { return cmp.Compare(b.Gen, a.Gen) })
		var good, damaged []string
		for _, c := range cs {
			switch {
			case deleting[c.Info.Key]:
			case list.damaged[c.Info.Key]:
				damaged = append(damaged, c.Info.Key)
			default:
				good = append(good, c.Info.Key)
			}
		}
		plan[name] = append(good, damaged...)
		if len(plan[name]) == 0 {
			err := ErrNotFound
			if len(cs) > 0 {
				err = errPruning
			}
			return nil, nil, fmt.Errorf("restoring backup %s from %s: %w", m.ID, r.store, &ChunkError{Chunk: name, Backups: []string{m.ID}, Err: err})
		}
	}
	return m, plan, nil
}
