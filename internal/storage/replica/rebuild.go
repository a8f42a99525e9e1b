package replica

import (
	"context"
	"errors"
	"fmt"
	"io"

	"golang.org/x/sync/errgroup"
)

// errSuperseded ends a copier whose replica was asked to rebuild from another source (or
// by another writer session).
var errSuperseded = errors.New("superseded by a new rebuild")

// startRebuild makes r a copy of sourceID on sourceAddr. A copier already running from the
// same source for the same writer session is kept: the call only waits until that rebuild
// has started. Any other running copier is cancelled and waited for, since a restarted
// target may pick another source, or even rebuild the old copier's source, punching it.
// A new writer session counts as a change too: its writer may have written the source
// before this call without sending us the write, which the running copier may already
// have passed. Then, in this order: Rebuilding is made durable (a cancelled copier never
// cleared it), so r is never chosen as a source even after a crash; r's file is punched
// whole and an empty fresh set starts, both under applyMu so no write slips between them;
// then a background copier pulls the source's allocated extents. Writes that arrive from
// now on mark their sectors fresh and the copier skips those.
// Source is what a rebuild copies from: another replica's data service (a Client), or a
// source in this process that can say its size and revision, list its data and read it (a
// backup in an object store, see Fill).
type Source interface {
	Info(ctx context.Context) (Info, error)
	Extents(ctx context.Context, off, length int64) ([]Extent, error)
	ReadAt(ctx context.Context, p []byte, off int64) error
}

// Fill rebuilds replica id, served here, from local, a source in this process named name
// (its RebuildSource is "local/<name>"): as a rebuild from a peer, with its progress,
// durability and failure reported the same way. The source may be smaller than the replica
// (a volume restored at a larger size). A fill from the same source already running is kept.
// A source that is an io.Closer is closed once the fill no longer reads it (or at once when
// it is not used).
func (s *Server) Fill(id, name string, local Source) error {
	r, err := s.acquire(id)
	if err != nil {
		closeSource(local)
		return err
	}
	defer s.release(r)
	return s.startRebuild(r, localSource, name, local)
}

// closeSource closes a local source that needs it (a backup's, which holds a marker in its
// store while it is open).
func closeSource(local Source) {
	if c, ok := local.(io.Closer); ok {
		_ = c.Close()
	}
}

// localSource is the address part of a Fill's RebuildSource.
const localSource = "local"

func (s *Server) startRebuild(r *replica, sourceAddr, sourceID string, local Source) error {
	var st *rebuildState
	for {
		epoch := r.durable().Epoch
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			closeSource(local)
			return ErrClosed
		}
		if sourceAddr == s.addr && sourceID == r.id {
			s.mu.Unlock()
			closeSource(local)
			return fmt.Errorf("cannot rebuild a replica from itself: %w", ErrInvalid)
		}
		old := s.rebuilds[r.id]
		if old == nil || !old.running {
			st = &rebuildState{
				running: true,
				source:  sourceAddr + "/" + sourceID,
				epoch:   epoch,
				writer:  r.owner.Load(),
				started: make(chan struct{}),
				stopped: make(chan struct{}),
			}
			break
		}
		if old.source == sourceAddr+"/"+sourceID && old.epoch == epoch {
			s.mu.Unlock()
			closeSource(local)
			<-old.started
			return old.startErr
		}
		// The old copier must be gone before the punch: a chunk it applied later would
		// land on the new copy as if it were the new source's.
		old.cancel(errSuperseded)
		s.mu.Unlock()
		<-old.stopped
	}
	ctx, cancel := context.WithCancelCause(s.ctx)
	st.cancel = cancel
	s.rebuilds[r.id] = st
	r.refs++ // the copier's
	s.copierWG.Add(1)
	s.mu.Unlock()

	fail := func(err error) error {
		s.noteSpace(r.id, err)
		msg := err.Error()
		st.err.Store(&msg)
		st.startErr = err
		close(st.started)
		s.endRebuild(r, st)
		closeSource(local)
		return err
	}
	if _, err := r.persist(func(m *meta) { m.Rebuilding, m.RebuildSource = true, st.source }); err != nil {
		return fail(err)
	}
	r.applyMu.Lock()
	err := r.punchAll()
	if err == nil {
		r.fresh = newSectorSet()
	}
	r.applyMu.Unlock()
	if err != nil {
		return fail(err)
	}
	close(st.started)
	s.log.Info("rebuild started", "replica", r.id, "source", st.source)
	go func() {
		err := s.copyFrom(ctx, r, st, sourceAddr, sourceID, local)
		closeSource(local)
		s.noteSpace(r.id, err)
		switch {
		case err == nil:
			s.log.Info("rebuild done", "replica", r.id, "source", st.source, "bytes", st.total.Load())
		case errors.Is(context.Cause(ctx), errSuperseded):
			// Its state is no longer the replica's: nobody reads this error.
			s.log.Info("rebuild superseded", "replica", r.id, "source", st.source)
		default:
			msg := fmt.Sprintf("rebuild from %s: %v", st.source, err)
			st.err.Store(&msg)
			s.log.Error(err, "rebuild failed", "replica", r.id, "source", st.source)
		}
		s.endRebuild(r, st)
	}()
	return nil
}

// endRebuild lets go of the replica; st.stopped tells a superseding rebuild it may punch.
func (s *Server) endRebuild(r *replica, st *rebuildState) {
	st.cancel(nil)
	r.applyMu.Lock()
	r.fresh = nil
	r.applyMu.Unlock()
	s.mu.Lock()
	st.running = false
	s.mu.Unlock()
	s.release(r)
	close(st.stopped)
	s.copierWG.Done()
}

type chunk struct{ off, n int64 }

// copyFrom copies the allocated extents of the source into r, several chunks in flight
// over one pipelined connection. Holes in the source are never written: r was punched
// whole when the rebuild started, so they are holes in r too, unless the writer wrote them.
func (s *Server) copyFrom(ctx context.Context, r *replica, st *rebuildState, addr, srcID string, local Source) error {
	src := local
	if src == nil {
		dctx, cancel := context.WithTimeout(ctx, s.o.PeerTimeout)
		conn, err := Dial(dctx, addr, s.clientTLS)
		cancel()
		if err != nil {
			return err
		}
		defer conn.Close()
		src = conn.Replica(srcID)
	}

	call := func(fn func(context.Context) error) error {
		cctx, cancel := context.WithTimeout(ctx, s.o.PeerTimeout)
		defer cancel()
		return fn(cctx)
	}
	var info Info
	if err := call(func(ctx context.Context) (err error) { info, err = src.Info(ctx); return }); err != nil {
		return err
	}
	startEpoch := info.Epoch
	if info.Rebuilding {
		return errors.New("source is itself rebuilding")
	}
	// A snapshot may fill a larger replica (a volume restored at a larger size): what lies
	// past the snapshot's end stays the hole the punch made.
	_, _, fromSnapshot := SplitSnapshotID(srcID)
	fromSnapshot = fromSnapshot || local != nil
	sizeOK := func(src, dst int64) bool { return src == dst || (fromSnapshot && src < dst) }
	if size := r.size.Load(); !sizeOK(info.Size, size) {
		return fmt.Errorf("source size %d differs from replica size %d", info.Size, size)
	}
	// The whole current size is copied: when the replica grows during the copy (its volume
	// was expanded), the grown range is listed and copied too.
	for copied := int64(0); ; {
		end := r.size.Load()
		if fromSnapshot {
			end = min(end, info.Size)
		}
		if copied >= end {
			break
		}
		if err := s.copyRange(ctx, r, st, src, call, copied, end); err != nil {
			return err
		}
		copied = end
	}

	// The source's revision now covers everything copied; take it before the sync so the
	// persisted revision never claims more than is on disk. The copy is only good if the
	// source stayed what it was at the start: not punched by a rebuild of its own, and
	// written by no writer session but the one that also writes r (a new session may
	// have written the source without sending r the write).
	if err := call(func(ctx context.Context) (err error) { info, err = src.Info(ctx); return }); err != nil {
		return err
	}
	if info.Rebuilding {
		return errors.New("source started rebuilding during the copy")
	}
	if info.Epoch != startEpoch {
		return fmt.Errorf("source had a new writer session during the copy (epoch %d, then %d)", startEpoch, info.Epoch)
	}
	if size := r.size.Load(); !sizeOK(info.Size, size) {
		// One of the two grew during the copy and the other not yet: what the larger holds
		// past the smaller's end was not copied. A rebuild once both have grown copies it.
		return fmt.Errorf("source size %d differs from replica size %d after the copy (the volume is growing)", info.Size, size)
	}
	// Checked under metaMu, so a superseding rebuild either sees rebuilding=false already
	// persisted (and sets it again) or keeps this copier from ever clearing it. A writer
	// that dropped this replica during the copy (it faulted it) went on writing the source
	// without it: what the copy took before those writes lacks them, so the copy claims the
	// source's revision only if the writer that fed it is still the one.
	superseded, dropped := false, false
	err := r.flush(func(m *meta) {
		if ctx.Err() != nil {
			superseded = true
			return
		}
		if st.writer != nil && r.owner.Load() != st.writer {
			dropped = true
			return
		}
		r.bumpRevision(info.Revision)
		m.Revision = max(m.Revision, info.Revision)
		m.Rebuilding, m.RebuildSource = false, ""
	})
	if err == nil && superseded {
		err = context.Cause(ctx)
	}
	if err == nil && dropped {
		err = errors.New("the writer session that fed this replica ended during the copy: writes may be missing")
	}
	return err
}

// copyRange copies the source's allocated extents in [lo, hi) into r, several chunks in
// flight over one pipelined connection; call bounds each request to the source.
func (s *Server) copyRange(ctx context.Context, r *replica, st *rebuildState, src Source, call func(func(context.Context) error) error, lo, hi int64) error {
	var exts []Extent
	if err := call(func(ctx context.Context) (err error) { exts, err = src.Extents(ctx, lo, hi-lo); return }); err != nil {
		return err
	}
	var total int64
	for _, e := range exts {
		total += e.Length
	}
	st.total.Add(total)

	g, gctx := errgroup.WithContext(ctx)
	chunks := make(chan chunk)
	g.Go(func() error {
		defer close(chunks)
		step := int64(s.o.RebuildChunk)
		for _, e := range exts {
			for off, end := e.Offset, e.Offset+e.Length; off < end; off += step {
				select {
				case chunks <- chunk{off, min(step, end-off)}:
				case <-gctx.Done():
					return gctx.Err()
				}
			}
		}
		return nil
	})
	for range s.o.RebuildParallel {
		g.Go(func() error {
			for c := range chunks {
				buf := getBuf(int(c.n))
				err := call(func(ctx context.Context) error { return src.ReadAt(ctx, *buf, c.off) })
				if err == nil && s.testBeforeApply != nil {
					s.testBeforeApply(ctx, c.off)
				}
				if err == nil {
					err = gctx.Err() // superseded or failed meanwhile: the chunk is moot
				}
				if err == nil {
					err = r.applyCopy(*buf, c.off)
				}
				putBuf(buf)
				if err != nil {
					return err
				}
				st.done.Add(c.n)
			}
			return nil
		})
	}
	return g.Wait()
}
