package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

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
}

// Restore writes backup id to dst. Before writing anything it checks that every chunk the
// backup lists is in the store; a chunk that does not read back as its name says stops
// the restore with a *ChunkError naming it. dst then holds part of the backup: a restore
// into a new volume hands that volume to nobody until Restore has returned nil.
func (r *Repository) Restore(ctx context.Context, id string, dst io.WriterAt, o RestoreOptions) (*Manifest, error) {
	m, err := r.Manifest(ctx, id)
	if err != nil {
		return nil, err
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 4
	}
	if err := r.present(ctx, m); err != nil {
		return nil, err
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
				plain, err := r.readChunk(gctx, name)
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

// present checks that every chunk backup m lists is stored, listing the chunks (one request per
// thousand) rather than asking for each.
func (r *Repository) present(ctx context.Context, m *Manifest) error {
	stored, err := r.storedChunks(ctx)
	if err != nil {
		return err
	}
	for _, name := range m.Chunks {
		if _, ok := stored[name]; name != "" && !ok {
			return fmt.Errorf("restoring backup %s from %s: %w", m.ID, r.store, &ChunkError{Chunk: name, Backups: []string{m.ID}, Err: ErrNotFound})
		}
	}
	return nil
}
