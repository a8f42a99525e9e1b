package backup

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// BackupOptions describe a backup.
type BackupOptions struct {
	// ID names the backup (a DNS-1123 subdomain). A backup of an ID that exists is that
	// one, returned as it is.
	ID string
	// Volume, Source and Labels are kept in the manifest.
	Volume, Source string
	Labels         map[string]string
	// Parent is the ID of the volume's previous backup, if any (it must exist); kept in
	// the manifest.
	Parent string
	// Concurrency is how many chunks are read, sealed and uploaded at once; default 4.
	Concurrency int
	// Progress, if set, is called after each chunk (never concurrently).
	Progress func(Progress)
	// Heartbeat is how often the backup tells Prune it still runs (renews its marker);
	// default a tenth of the store's pending timeout, 1 minute at most. A backup whose
	// marker once went unrenewed for half the pending timeout fails rather than write its
	// manifest (see Prune).
	Heartbeat time.Duration
	// Commit, if set, is called once every chunk is stored, right before the manifest is
	// written: an error stops the backup, which then does not exist. The caller checks
	// there that the backup is still wanted. Until the manifest is written the backup's
	// marker is in the store (Running), so one that Running no longer finds has either
	// written its manifest or never will.
	Commit func(context.Context) error
}

// Progress is how far a backup or restore is.
type Progress struct {
	// Done and Total are bytes of the volume.
	Done, Total int64
	// Uploaded and UploadedBytes: objects and bytes written to the store so far (for a
	// restore, read from it).
	Uploaded, UploadedBytes int64
}

// Backup reads size bytes of src, the volume, and stores them as backup o.ID. Only
// chunks the store lacks are uploaded. It returns the manifest once it is stored: until
// then the backup does not exist, and a Backup of the same ID again resumes (what was
// uploaded is found).
func (r *Repository) Backup(ctx context.Context, src io.ReaderAt, size int64, o BackupOptions) (*Manifest, error) {
	if err := checkID(o.ID); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, fmt.Errorf("backup %s: size %d", o.ID, size)
	}
	if m, err := r.Manifest(ctx, o.ID); err == nil {
		if m.Volume != o.Volume || m.Size != size {
			return nil, fmt.Errorf("backup %s exists in %s, of %s (%d bytes), not of %s (%d bytes)", o.ID, r.store, m.Volume, m.Size, o.Volume, size)
		}
		return m, nil
	} else if !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 4
	}
	if o.Heartbeat <= 0 || o.Heartbeat > r.pendingTimeout/4 {
		o.Heartbeat = min(time.Minute, r.pendingTimeout/10)
	}
	m := &Manifest{ID: o.ID, Volume: o.Volume, Source: o.Source, Parent: o.Parent, Labels: o.Labels,
		Created: time.Now().UTC(), Size: size, ChunkSize: r.chunkSize, Chunks: make([]string, chunksOf(size, r.chunkSize))}

	// The marker first, with the newest epoch, then the chunks stored: every copy this backup
	// reuses is one that epoch neither condemns nor deletes, and a prune deletes nothing
	// while a backup that read an older epoch runs (see Prune). A marker of its own: two runs
	// of one backup (a retry on another node while the first still runs) may have read
	// different epochs.
	sess, err := r.openSession(ctx, pendingPrefix+o.ID+"/"+randomID(), o.ID, o.Heartbeat)
	if err != nil {
		return nil, fmt.Errorf("backup %s: %w", o.ID, err)
	}
	defer sess.stop(ctx)
	gen := sess.ep.Seq
	// What the store holds, listed once (a thousand names a request) rather than asked
	// chunk by chunk: a HEAD per chunk cost a third of a full backup's time. A chunk another
	// backup uploads meanwhile is uploaded again, which is harmless.
	list, err := r.storedChunks(ctx)
	if err != nil {
		return nil, fmt.Errorf("backup %s: %w", o.ID, err)
	}
	// known: the chunks with a copy this backup may reuse (stored, not avoided by its epoch,
	// not found damaged), or claimed by this backup's upload. A chunk met again while its
	// upload runs is not waited for: the manifest is written only once every upload has
	// succeeded.
	avoided := sess.ep.avoided()
	known := map[string]bool{}
	for key, c := range list.copies {
		if !avoided[key] && !list.damaged[key] {
			known[c.Name] = true
		}
	}
	if o.Parent != "" {
		// The parent is named in the manifest; what it lists needs no special case, being
		// stored, and a chunk of it that went missing is uploaded again.
		if _, err := r.Manifest(ctx, o.Parent); err != nil {
			return nil, fmt.Errorf("backup %s: its parent: %w", o.ID, err)
		}
	}
	var (
		mu    sync.Mutex // known, stats, done, and the calls of o.Progress
		stats = Stats{Chunks: int64(len(m.Chunks))}
		done  int64
	)
	count := func(n int64, f func(*Stats)) {
		mu.Lock()
		defer mu.Unlock()
		f(&stats)
		done += n
		if o.Progress != nil {
			o.Progress(Progress{Done: done, Total: size, Uploaded: stats.Uploaded, UploadedBytes: stats.UploadedBytes})
		}
	}
	zero := make([]byte, r.chunkSize)
	// Buffers of a chunk and of its sealed form, reused: made anew, each is zeroed first,
	// which cost as much as encrypting it.
	reads := sync.Pool{New: func() any { b := make([]byte, r.chunkSize); return &b }}
	seals := sync.Pool{New: func() any { b := make([]byte, 0, sealedSize(r.chunkSize)); return &b }}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(o.Concurrency)
	for i := range m.Chunks {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			off := int64(i) * int64(r.chunkSize)
			n := min(int64(r.chunkSize), size-off)
			bp := reads.Get().(*[]byte)
			defer reads.Put(bp)
			buf := (*bp)[:n]
			if got, err := src.ReadAt(buf, off); int64(got) < n {
				return fmt.Errorf("backup %s: reading the volume at %d: %d of %d bytes: %w", o.ID, off, got, n, err)
			}
			if bytes.Equal(buf, zero[:n]) {
				count(n, func(s *Stats) { s.Zero++ })
				return nil
			}
			name := r.keys.name(buf)
			m.Chunks[i] = name
			mu.Lock()
			have := known[name]
			known[name] = true
			mu.Unlock()
			if have {
				count(n, func(s *Stats) { s.Reused++ })
				return nil
			}
			sp := seals.Get().(*[]byte)
			defer seals.Put(sp)
			sealed := r.sealChunk(buf, name, *sp)
			// Only this epoch's copy: one that existed before the epoch may be deleted now.
			key := chunkKey(name, gen)
			if err := r.store.Put(gctx, key, sealed); err != nil {
				return fmt.Errorf("backup %s: %w", o.ID, err)
			}
			if list.damaged[key] {
				// Written again whole: the record no longer holds (one a verify writes
				// again meanwhile costs one more upload, later).
				if err := r.store.Delete(gctx, damagedKey(key)); err != nil {
					return fmt.Errorf("backup %s: %w", o.ID, err)
				}
			}
			count(n, func(s *Stats) { s.Uploaded++; s.UploadedBytes += int64(len(sealed)) })
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if o.Commit != nil {
		if err := o.Commit(ctx); err != nil {
			return nil, fmt.Errorf("backup %s: %w", o.ID, err)
		}
	}
	// Last, right before the manifest: a backup whose marker a prune may have found older
	// than the pending timeout, at any time since it began, may reuse a deleted chunk.
	if err := sess.fresh(); err != nil {
		return nil, fmt.Errorf("backup %s: %w; back it up again", o.ID, err)
	}
	m.Stats = stats
	// The manifest must be stored before a prune could take this backup for dead: at most a
	// quarter of the pending timeout (fresh allowed half).
	mctx, cancel := context.WithDeadline(ctx, r.now().Add(r.pendingTimeout/4))
	defer cancel()
	if err := r.putManifest(mctx, m); err != nil {
		return nil, fmt.Errorf("backup %s: writing its manifest to %s: %w", o.ID, r.store, err)
	}
	return m, nil
}

// Running tells whether backup id runs: its marker was renewed within the time after which
// Prune takes a backup for dead.
func (r *Repository) Running(ctx context.Context, id string) (bool, error) {
	live, err := r.liveMarkers(ctx, pendingPrefix)
	return slices.ContainsFunc(live, func(m marker) bool { return m.ID == id }), err
}
