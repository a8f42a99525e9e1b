package target

import "sync"

// rangeLock serializes overlapping byte ranges. Writes hold their range from before the
// revision is taken until every replica has answered, so two overlapping writes are applied
// in the same order everywhere; disjoint writes proceed in parallel.
type rangeLock struct {
	mu   sync.Mutex
	held []*heldRange
}

type heldRange struct {
	off, end int64
	done     chan struct{}
}

func (l *rangeLock) lock(off, end int64) *heldRange {
	for {
		l.mu.Lock()
		var wait chan struct{}
		for _, h := range l.held {
			if h.off < end && off < h.end {
				wait = h.done
				break
			}
		}
		if wait == nil {
			h := &heldRange{off: off, end: end, done: make(chan struct{})}
			l.held = append(l.held, h)
			l.mu.Unlock()
			return h
		}
		l.mu.Unlock()
		<-wait
	}
}

func (l *rangeLock) unlock(h *heldRange) {
	l.mu.Lock()
	for i, x := range l.held {
		if x == h {
			l.held = append(l.held[:i], l.held[i+1:]...)
			break
		}
	}
	l.mu.Unlock()
	close(h.done)
}
