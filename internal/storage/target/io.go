package target

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/crdipc/crdipc/internal/storage/replica"
)

// ReadAt reads from a healthy replica, the local one first; a replica that fails is faulted
// and the next one tried. Reads do not take the range lock: a read racing an overlapping
// write may see either, as with any block device, but a read issued after a write was
// acknowledged sees it, since every healthy replica applied it before the ack.
func (e *Engine) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read at negative offset %d", off)
	}
	size := e.size.Load()
	if off >= size {
		return 0, io.EOF
	}
	n, short := len(p), false
	if int64(n) > size-off {
		n, short = int(size-off), true
	}
	for done := 0; done < n; {
		c := min(n-done, maxIO)
		if err := e.read(p[done:done+c], off+int64(done)); err != nil {
			return done, err
		}
		done += c
	}
	if short {
		return n, io.EOF
	}
	return n, nil
}

type dest struct {
	m       *member
	r       Replica
	gen     uint64
	healthy bool
}

func (e *Engine) read(p []byte, off int64) error {
	tried := map[*member]bool{}
	var lastErr error
	for {
		t, ok, closed := e.readTarget(tried)
		if closed {
			return ErrClosed
		}
		if !ok {
			if lastErr != nil {
				return fmt.Errorf("%w to read %d bytes at %d (last error: %w)", ErrUnavailable, len(p), off, lastErr)
			}
			return fmt.Errorf("%w to read %d bytes at %d", ErrUnavailable, len(p), off)
		}
		tried[t.m] = true
		ctx, cancel := context.WithTimeout(e.ioCtx, e.ioTimeout)
		err := t.r.ReadAt(ctx, p, off)
		cancel()
		if err == nil {
			return nil
		}
		lastErr = fmt.Errorf("replica %s: read: %w", t.m.ID, err)
		e.fault(t.m, t.gen, lastErr)
	}
}

// readTarget picks a healthy replica not tried yet: the local one, else round robin.
func (e *Engine) readTarget(tried map[*member]bool) (_ dest, ok, closed bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return dest{}, false, true
	}
	for _, m := range e.order {
		if m.Local && m.state == Healthy && !tried[m] {
			return dest{m: m, r: m.r, gen: m.gen}, true, false
		}
	}
	for i := range e.order {
		m := e.order[(e.next+i)%len(e.order)]
		if m.state == Healthy && !tried[m] {
			e.next = (e.next + i + 1) % len(e.order)
			return dest{m: m, r: m.r, gen: m.gen}, true, false
		}
	}
	return dest{}, false, false
}

// WriteAt writes p at off to every replica of the write set and returns once at least
// ConsistencyFactor healthy replicas applied it and every other one answered or was
// faulted. Writes that are not whole sectors are widened by read-modify-write. Overlapping
// writes are serialized so that every replica applies them in the same order.
func (e *Engine) WriteAt(p []byte, off int64) (int, error) {
	if size := e.size.Load(); off < 0 || off+int64(len(p)) > size {
		return 0, fmt.Errorf("write of %d bytes at %d outside the volume (%d bytes)", len(p), off, size)
	}
	if len(p) == 0 {
		return 0, nil
	}
	lo := off / SectorSize * SectorSize
	hi := (off + int64(len(p)) + SectorSize - 1) / SectorSize * SectorSize
	h := e.locks.lock(lo, hi)
	defer e.locks.unlock(h)

	buf := p
	end := off + int64(len(p))
	if lo != off || hi != end {
		// The partial first and last sectors are read under the range lock, so no
		// overlapping write can slip in between the read and the write.
		buf = make([]byte, hi-lo)
		if lo != off {
			if err := e.read(buf[:SectorSize], lo); err != nil {
				return 0, fmt.Errorf("read-modify-write: %w", err)
			}
		}
		if last := hi - SectorSize; hi != end && !(lo != off && last == lo) {
			if err := e.read(buf[last-lo:], last); err != nil {
				return 0, fmt.Errorf("read-modify-write: %w", err)
			}
		}
		copy(buf[off-lo:], p)
	}
	for done := 0; done < len(buf); {
		c := min(len(buf)-done, maxIO)
		if err := e.writeChunk(buf[done:done+c], lo+int64(done)); err != nil {
			// Nothing of this call is acknowledged; a prefix may be on some replicas,
			// which is what a torn write on a disk looks like too.
			return 0, err
		}
		done += c
	}
	return len(p), nil
}

// writeChunk writes one request under the range lock. When a replica that was healthy
// fails, the same data is written again under a new revision to the replicas that remain:
// then every remaining replica has a revision above anything the faulted one can have
// (it may have applied writes up to the last revision handed out), so after a crash it
// can never be mistaken for the freshest.
//
// With QuorumWait, a shortfall of healthy replicas — before the write, or because one
// failed during it while another was still rebuilding (pool agents restarting one after
// the other) — waits for the quorum and writes again, until QuorumWait has passed. The
// write was acknowledged to nobody, so writing it again under a new revision is what the
// fence does anyway.
func (e *Engine) writeChunk(p []byte, off int64) error {
	deadline := time.Now().Add(e.quorumWait)
	e.awaitQuorum(deadline) // the fan-out below reports a shortfall
	for {
		fence, err := e.fanOutWrite(p, off)
		switch {
		case err == nil && !fence:
			return nil
		case err == nil:
			continue
		case errors.Is(err, ErrNoQuorum) && e.awaitQuorum(deadline):
			continue
		}
		return err
	}
}

// awaitQuorum waits until ConsistencyFactor replicas are healthy or the deadline passes,
// and reports whether they are. Without QuorumWait it does not wait.
func (e *Engine) awaitQuorum(deadline time.Time) bool {
	if e.quorumWait <= 0 || !time.Now().Before(deadline) {
		return false
	}
	ctx, cancel := context.WithDeadline(e.ioCtx, deadline)
	defer cancel()
	return e.WaitQuorum(ctx) == nil
}

// fanOutWrite sends p to the write set under a fresh revision and waits for every replica.
// fence reports that a healthy replica failed.
func (e *Engine) fanOutWrite(p []byte, off int64) (fence bool, err error) {
	e.barrier.RLock()
	defer e.barrier.RUnlock()

	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return false, ErrClosed
	}
	// The revision and the write set are taken together: a replica faulted before this
	// point gets no write with this or a later revision.
	var set []dest
	healthy := 0
	for _, m := range e.order {
		if m.state == Healthy || m.state == Rebuilding {
			set = append(set, dest{m: m, r: m.r, gen: m.gen, healthy: m.state == Healthy})
			if m.state == Healthy {
				healthy++
			}
		}
	}
	if healthy < e.cf {
		e.mu.Unlock()
		return false, fmt.Errorf("%w: %d healthy replicas, %d needed", ErrNoQuorum, healthy, e.cf)
	}
	e.rev++
	rev := e.rev
	e.mu.Unlock()

	errs, acked, failures, fence := e.writeEach(set, p, off, rev)
	e.mu.Lock()
	for i, t := range set {
		if t.healthy && errs[i] == nil && t.m.removed {
			// Its copy no longer counts: the replica is on its way out.
			acked--
		}
	}
	if acked >= e.cf && rev > e.ackedRev {
		e.ackedRev = rev
	}
	e.mu.Unlock()
	if acked < e.cf {
		return false, fmt.Errorf("%w: write of %d bytes at %d applied on %d healthy replicas, %d needed: %w",
			ErrNoQuorum, len(p), off, acked, e.cf, errors.Join(failures...))
	}
	return fence, nil
}

// Flush makes every acknowledged write durable on the replicas of the write set; it needs
// ConsistencyFactor healthy replicas to succeed.
//
// With QuorumWait, a shortfall waits for the quorum and flushes again, as writeChunk does.
func (e *Engine) Flush() error {
	deadline := time.Now().Add(e.quorumWait)
	e.awaitQuorum(deadline)
	for {
		err := e.flushOnce()
		if errors.Is(err, ErrNoQuorum) && e.awaitQuorum(deadline) {
			continue
		}
		return err
	}
}

func (e *Engine) flushOnce() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return ErrClosed
	}
	var set []dest
	for _, m := range e.order {
		if m.state == Healthy || m.state == Rebuilding {
			set = append(set, dest{m: m, r: m.r, gen: m.gen, healthy: m.state == Healthy})
		}
	}
	e.mu.Unlock()

	_, ok, failures, _ := e.onEach(set, "flush", func(ctx context.Context, r Replica) error { return r.Flush(ctx) })
	if ok < e.cf {
		return fmt.Errorf("%w: flush succeeded on %d healthy replicas, %d needed: %w", ErrNoQuorum, ok, e.cf, errors.Join(failures...))
	}
	return nil
}

// writeStarter is a Replica that can send a write and wait for it later (*replica.Client
// can): one goroutine then has the write in flight to every replica.
type writeStarter interface {
	StartWriteAt(ctx context.Context, p []byte, off int64, rev uint64) *replica.PendingWrite
}

// writeEach is onEach for a write. When every replica of set can start a write without
// waiting, this goroutine sends all of them and then waits, under one IOTimeout: a write in
// flight costs no goroutine per replica (nor their wake-ups and timers), which at 4 KiB was
// as dear as the write.
func (e *Engine) writeEach(set []dest, p []byte, off int64, rev uint64) (errs []error, ok int, failures []error, fence bool) {
	starters := make([]writeStarter, len(set))
	for i, t := range set {
		ws, can := t.r.(writeStarter)
		if !can {
			return e.onEach(set, "write", func(ctx context.Context, r Replica) error {
				return r.WriteAt(ctx, p, off, rev)
			})
		}
		starters[i] = ws
	}
	ctx, cancel := context.WithTimeout(e.ioCtx, e.ioTimeout)
	defer cancel()
	pending := make([]*replica.PendingWrite, len(set))
	for i, ws := range starters {
		pending[i] = ws.StartWriteAt(ctx, p, off, rev)
	}
	errs = make([]error, len(set))
	for i, w := range pending {
		errs[i] = w.Wait(ctx)
	}
	ok, failures, fence = e.tally(set, "write", errs)
	return errs, ok, failures, fence
}

// onEach runs call on every replica of set at once, each bounded by IOTimeout, and waits for
// all of them. A replica that fails is faulted (fence: a healthy one was); ok counts the
// healthy replicas that succeeded. what names the operation in errors.
func (e *Engine) onEach(set []dest, what string, call func(context.Context, Replica) error) (errs []error, ok int, failures []error, fence bool) {
	errs = make([]error, len(set))
	var wg sync.WaitGroup
	for i, t := range set {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(e.ioCtx, e.ioTimeout)
			defer cancel()
			errs[i] = call(ctx, t.r)
		}()
	}
	wg.Wait()
	ok, failures, fence = e.tally(set, what, errs)
	return errs, ok, failures, fence
}

// tally faults the replicas of set whose call failed (errs[i]; fence: a healthy one was)
// and counts the healthy ones that succeeded.
func (e *Engine) tally(set []dest, what string, errs []error) (ok int, failures []error, fence bool) {
	for i, t := range set {
		if errs[i] == nil {
			if t.healthy {
				ok++
			}
			continue
		}
		err := fmt.Errorf("replica %s: %s: %w", t.m.ID, what, errs[i])
		failures = append(failures, err)
		if e.fault(t.m, t.gen, err) {
			fence = true
		}
	}
	return ok, failures, fence
}
