package backup

import (
	"bytes"
	"context"
	"encoding/json"
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
	// Heartbeat is how often the backup tells Prune it still runs; default 1 minute. A
	// backup that could not tell it for PendingTimeout/2 stops (see Prune).
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

// pending is a running backup's marker: Prune does not delete chunks that the backups
// running when it condemned them may still list.
type pending struct {
	ID      string    `json:"id"`
	Started time.Time `json:"started"`
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
	if o.Heartbeat <= 0 {
		o.Heartbeat = time.Minute
	}
	m := &Manifest{ID: o.ID, Volume: o.Volume, Source: o.Source, Parent: o.Parent, Labels: o.Labels,
		Created: time.Now().UTC(), Size: size, ChunkSize: r.chunkSize, Chunks: make([]string, chunksOf(size, r.chunkSize))}

	// The marker first, then what Prune condemned: a prune that condemns after this read
	// lists this backup as running, and waits for it.
	hb, err := r.startHeartbeat(ctx, o.ID, o.Heartbeat)
	if err != nil {
		return nil, err
	}
	defer hb.stop()
	condemned, err := r.condemned(ctx)
	if err != nil {
		return nil, err
	}
	// What the store holds, listed once (a thousand names a request) rather than asked
	// chunk by chunk: a HEAD per chunk cost a third of a full backup's time. A chunk
	// another backup uploads meanwhile is uploaded again, which is harmless.
	known, err := r.storedChunks(ctx)
	if err != nil {
		return nil, fmt.Errorf("backup %s: %w", o.ID, err)
	}
	// known: stored and not condemned (a condemned chunk is uploaded again), or claimed by
	// this backup's upload. A chunk met again while its upload runs is not waited for:
	// the manifest is written only once every upload has succeeded.
	for name := range condemned {
		delete(known, name)
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
			_, have := known[name]
			known[name] = ObjectInfo{}
			mu.Unlock()
			if have {
				count(n, func(s *Stats) { s.Reused++ })
				return nil
			}
			sp := seals.Get().(*[]byte)
			defer seals.Put(sp)
			sealed := r.sealChunk(buf, name, *sp)
			if err := r.store.Put(gctx, chunkKey(name), sealed); err != nil {
				return fmt.Errorf("backup %s: %w", o.ID, err)
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
	if err := hb.fresh(); err != nil {
		return nil, fmt.Errorf("backup %s: %w", o.ID, err)
	}
	if o.Commit != nil {
		if err := o.Commit(ctx); err != nil {
			return nil, fmt.Errorf("backup %s: %w", o.ID, err)
		}
	}
	m.Stats = stats
	if err := r.putManifest(ctx, m); err != nil {
		return nil, fmt.Errorf("backup %s: writing its manifest to %s: %w", o.ID, r.store, err)
	}
	return m, nil
}

// Running tells whether backup id runs: its marker was renewed within the time after which
// Prune takes a backup for dead.
func (r *Repository) Running(ctx context.Context, id string) (bool, error) {
	ids, _, err := r.running(ctx, defaultPendingTimeout)
	return slices.Contains(ids, id), err
}

// heartbeat keeps a running backup's pending marker fresh.
type heartbeat struct {
	r       *Repository
	key     string
	every   time.Duration
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	last    time.Time // of the last marker written
	lastErr error
}

func (r *Repository) startHeartbeat(ctx context.Context, id string, every time.Duration) (*heartbeat, error) {
	h := &heartbeat{r: r, key: pendingPrefix + id, every: every, done: make(chan struct{})}
	data, _ := json.Marshal(pending{ID: id, Started: time.Now().UTC()})
	if err := r.store.Put(ctx, h.key, data); err != nil {
		return nil, fmt.Errorf("backup %s: writing its marker to %s: %w", id, r.store, err)
	}
	h.last = time.Now()
	hctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	h.cancel = cancel
	go func() {
		defer close(h.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-hctx.Done():
				return
			case <-t.C:
			}
			err := r.store.Put(hctx, h.key, data)
			h.mu.Lock()
			if err == nil {
				h.last = time.Now()
			}
			h.lastErr = err
			h.mu.Unlock()
		}
	}()
	return h, nil
}

// fresh fails if the marker was last written longer ago than a prune waits for a silent
// backup (PendingTimeout's default, halved): a prune may then have taken this backup for
// dead and deleted chunks it reuses.
func (h *heartbeat) fresh() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if since := time.Since(h.last); since > defaultPendingTimeout/2 {
		return fmt.Errorf("its marker in %s was last renewed %s ago (%v): a prune may have taken it for dead; back it up again", h.r.store, since.Round(time.Second), h.lastErr)
	}
	return nil
}

// stop ends the heartbeat and removes the marker.
func (h *heartbeat) stop() {
	h.cancel()
	<-h.done
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = h.r.store.Delete(ctx, h.key) // a marker left behind only delays a prune (PendingTimeout)
}
