package target

import (
	"context"
	"fmt"
	"sync"
)

// smallerErr is why a replica cannot be in the write set of a volume of size bytes.
func smallerErr(replicaSize, size int64) error {
	return fmt.Errorf("replica size %d is smaller than the volume (%d)", replicaSize, size)
}

// Grow makes the volume size bytes, a positive multiple of SectorSize. A size at or below
// the current one changes nothing and returns nil: volumes never shrink, and a repeated
// call (a retried expansion) is harmless.
//
// Every healthy replica must already hold size bytes (their nodes grow them first): Grow
// asks each for its Info and refuses, naming the replica and its size, unless all do, and
// then nothing changes. A rebuilding replica that is still smaller is faulted; it rejoins
// once it has grown, and its rebuild then copies the whole new size.
//
// The new size takes effect at once for every later ReadAt and WriteAt; reads and writes
// past the old end fail until then. I/O in flight is within the old size and is not
// waited for. ctx bounds the Info calls.
func (e *Engine) Grow(ctx context.Context, size int64) error {
	if size <= 0 || size%SectorSize != 0 {
		return fmt.Errorf("growing the volume to %d bytes: the size must be a positive multiple of %d", size, SectorSize)
	}
	e.growMu.Lock()
	defer e.growMu.Unlock()
	for {
		old := e.size.Load()
		if size <= old {
			return nil
		}
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

		infos, errs := make([]Info, len(set)), make([]error, len(set))
		var wg sync.WaitGroup
		for i, t := range set {
			wg.Add(1)
			go func() {
				defer wg.Done()
				infos[i], errs[i] = e.infoOf(ctx, t.r)
			}()
		}
		wg.Wait()
		holds := map[*member]uint64{} // the members that hold size, with their generation
		type misfit struct {
			dest
			err error
		}
		var small []misfit
		for i, t := range set {
			switch {
			case errs[i] == nil && infos[i].Size >= size:
				holds[t.m] = t.gen
			case !t.healthy && errs[i] != nil:
				small = append(small, misfit{t, fmt.Errorf("info while growing the volume: %w", errs[i])})
			case !t.healthy:
				small = append(small, misfit{t, smallerErr(infos[i].Size, size)})
			case errs[i] != nil:
				return fmt.Errorf("growing the volume to %d bytes: replica %s: %w", size, t.m.ID, errs[i])
			default:
				return fmt.Errorf("growing the volume to %d bytes: replica %s holds %d bytes; every healthy replica must be grown first", size, t.m.ID, infos[i].Size)
			}
		}

		// The size changes only if every replica healthy now was found large enough: one
		// that became healthy meanwhile (a rebuild finished) is asked again.
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			return ErrClosed
		}
		again := false
		for _, m := range e.order {
			if g, ok := holds[m]; m.state == Healthy && (!ok || g != m.gen) {
				again = true
			}
		}
		if again {
			e.mu.Unlock()
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("growing the volume to %d bytes: %w", size, err)
			}
			continue
		}
		e.size.Store(size)
		e.changedLocked()
		e.mu.Unlock()
		for _, t := range small {
			e.fault(t.m, t.gen, t.err)
		}
		e.log.Info("volume grown", "from", old, "to", size)
		return nil
	}
}
