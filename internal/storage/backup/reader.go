package backup

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Extent is a range of a backup's volume that holds data (not zeros).
type Extent struct {
	Offset, Length int64
}

// Reader reads one backup's volume at any offset, fetching and checking each chunk once:
// what a replica is filled from (the replica package's Source asks for Extents and ReadAt
// pieces smaller than a chunk, in parallel). A chunk is kept only until every byte of it has
// been read once, so memory stays at the chunks being read.
type Reader struct {
	r    *Repository
	m    *Manifest
	sess *session
	plan map[string][]string

	closeOnce sync.Once
	mu        sync.Mutex
	chunks    map[int]*chunkRead
}

type chunkRead struct {
	ready chan struct{}
	data  []byte
	err   error
	read  int64 // bytes handed out so far
}

// Reader opens backup id for reading. Like Restore, it registers as a running restore (no
// prune deletes what it reads until Close) and first checks that every chunk the backup lists is
// in the store (a *ChunkError naming the first missing one otherwise), so a replica is never
// filled with part of a backup that cannot be read whole. Close it when done.
func (r *Repository) Reader(ctx context.Context, id string) (*Reader, error) {
	sess, m, plan, err := r.openRestore(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	return &Reader{r: r, m: m, sess: sess, plan: plan, chunks: map[int]*chunkRead{}}, nil
}

// Close ends the restore: its marker is removed. Reads after Close may fail.
func (b *Reader) Close() error {
	b.closeOnce.Do(func() { b.sess.stop(context.Background()) })
	return nil
}

// Manifest is the backup's manifest.
func (b *Reader) Manifest() *Manifest { return b.m }

// Extents lists the ranges of [off, off+length) that hold data: the backup's non-zero
// chunks, adjacent ones merged.
func (b *Reader) Extents(off, length int64) []Extent {
	cs := int64(b.m.ChunkSize)
	end := min(off+length, b.m.Size)
	var out []Extent
	for i := off / cs; i*cs < end; i++ {
		if b.m.Chunks[i] == "" {
			continue
		}
		lo, hi := max(i*cs, off), min((i+1)*cs, end)
		if n := len(out); n > 0 && out[n-1].Offset+out[n-1].Length == lo {
			out[n-1].Length += hi - lo
		} else {
			out = append(out, Extent{lo, hi - lo})
		}
	}
	return out
}

// ReadAt fills p with the volume's bytes at off; past the backup's end it is an error.
func (b *Reader) ReadAt(ctx context.Context, p []byte, off int64) error {
	if off < 0 || off+int64(len(p)) > b.m.Size {
		return fmt.Errorf("backup %s: reading %d bytes at %d, past its size %d", b.m.ID, len(p), off, b.m.Size)
	}
	cs := int64(b.m.ChunkSize)
	for len(p) > 0 {
		i := int(off / cs)
		within := off - int64(i)*cs
		n := min(int64(len(p)), cs-within)
		if b.m.Chunks[i] == "" {
			clear(p[:n])
		} else {
			data, err := b.chunk(ctx, i, n)
			if err != nil {
				return err
			}
			if int64(len(data)) < within+n {
				return fmt.Errorf("backup %s: %w", b.m.ID, &ChunkError{Chunk: b.m.Chunks[i], Backups: []string{b.m.ID},
					Err: fmt.Errorf("it holds %d bytes where the backup needs %d", len(data), within+n)})
			}
			copy(p[:n], data[within:within+n])
		}
		p, off = p[n:], off+n
	}
	return nil
}

// chunk returns chunk i's plaintext, fetching it if no other read has; n bytes of it are
// being read, and once all of it has been the chunk is dropped.
func (b *Reader) chunk(ctx context.Context, i int, n int64) ([]byte, error) {
	b.mu.Lock()
	c := b.chunks[i]
	fetch := c == nil
	if fetch {
		c = &chunkRead{ready: make(chan struct{})}
		b.chunks[i] = c
	}
	b.mu.Unlock()
	if fetch {
		c.data, c.err = b.r.readChunk(ctx, b.m.Chunks[i], b.plan[b.m.Chunks[i]])
		var ce *ChunkError
		if errors.As(c.err, &ce) {
			ce.Backups = []string{b.m.ID}
		}
		if c.err != nil {
			c.err = fmt.Errorf("backup %s in %s: %w", b.m.ID, b.r.store, c.err)
		}
		close(c.ready)
	}
	select {
	case <-c.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.err != nil {
		// A failed fetch is not kept: a retry fetches again.
		delete(b.chunks, i)
		return nil, c.err
	}
	c.read += n
	if c.read >= int64(len(c.data)) {
		delete(b.chunks, i)
	}
	return c.data, nil
}
