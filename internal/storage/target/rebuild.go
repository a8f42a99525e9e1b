package target

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/crdipc/crdipc/internal/storage/replica"
)

// loop retries faulted replicas every RejoinInterval (a new member at once) and watches
// rebuilding ones every pollInterval.
func (e *Engine) loop() {
	defer e.wg.Done()
	t := time.NewTicker(e.pollInterval)
	defer t.Stop()
	for {
		e.tick()
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		case <-e.kick:
		}
	}
}

func (e *Engine) tick() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	if e.recoverableLocked() {
		// Nobody is healthy, so nobody can be rebuilt from: elect a source again, as at
		// start. Every member is marked busy so no rejoin races the election.
		for _, m := range e.order {
			m.busy = true
		}
		members := append([]*member(nil), e.order...)
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			defer func() {
				e.mu.Lock()
				for _, m := range members {
					m.busy = false
				}
				e.mu.Unlock()
				e.poke()
			}()
			e.recover(members)
		}()
		return
	}
	now := time.Now()
	for _, m := range e.order {
		if m.busy || m.removed {
			continue
		}
		var work func(*member)
		switch m.state {
		case Faulted:
			if now.Before(m.retryAt) {
				continue
			}
			m.retryAt = now.Add(e.rejoinInterval)
			work = e.rejoin
		case Rebuilding:
			work = e.poll
		default:
			continue
		}
		m.busy = true
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			defer func() {
				e.mu.Lock()
				m.busy = false
				e.mu.Unlock()
			}()
			work(m)
		}()
	}
}

// rejoin reconnects a faulted replica and admits it as rebuilding. It is always rebuilt, even
// when its revision looks current: a write may have failed on it (or timed out and landed
// later) without raising its revision.
func (e *Engine) rejoin(m *member) {
	e.mu.Lock()
	r, gen := m.r, m.gen
	e.mu.Unlock()
	fail := func(err error) {
		e.mu.Lock()
		if m.gen == gen && m.state == Faulted && !m.removed {
			m.err = err
		}
		e.mu.Unlock()
		if m.Dial != nil {
			e.closeHandle(m, r)
		}
		e.log.Debug("replica rejoin failed", "replica", m.ID, "err", err)
	}
	if r == nil {
		var err error
		if r, err = e.dial(e.ctx, m); err != nil {
			fail(err)
			return
		}
	}
	info, err := e.infoOf(e.ctx, r)
	if err != nil {
		fail(err)
		return
	}
	e.mu.Lock()
	m.info = info
	// Later writes must carry revisions above whatever this replica claims.
	e.rev = max(e.rev, info.Revision)
	e.mu.Unlock()
	if size := e.size.Load(); info.Size < size {
		fail(smallerErr(info.Size, size))
		return
	}
	if err := e.open(e.ctx, r); err != nil {
		fail(err)
		return
	}
	src := e.rebuildSource(m)
	if src == nil {
		fail(errors.New("no healthy replica to rebuild from"))
		return
	}
	e.startRebuild(m, r, src)
}

// rebuildSource picks a healthy replica other than m that others can pull from.
func (e *Engine) rebuildSource(m *member) *member {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.order {
		if s != m && s.state == Healthy && s.Addr != "" {
			return s
		}
	}
	return nil
}

// startRebuild admits faulted m (handle r, writer session open) to the write set as
// rebuilding and has it copy from src. It runs with no write in flight, so that every write
// is either complete on both src and m before the replica starts tracking fresh sectors, or
// is sent to m after, where it is tracked and never overwritten by the copy.
func (e *Engine) startRebuild(m *member, r Replica, src *member) {
	e.barrier.Lock()
	e.mu.Lock()
	if e.closed || m.removed || m.state != Faulted || src.state != Healthy {
		e.mu.Unlock()
		e.barrier.Unlock()
		if m.Dial != nil && r != m.r {
			e.closeHandle(m, r)
		}
		return
	}
	if size := e.size.Load(); m.info.Size < size {
		// The volume grew (Grow) since rejoin looked at the replica.
		m.err = smallerErr(m.info.Size, size)
		e.mu.Unlock()
		e.barrier.Unlock()
		if m.Dial != nil && r != m.r {
			e.closeHandle(m, r)
		}
		return
	}
	m.gen++
	gen := m.gen
	m.r, m.state, m.err = r, Rebuilding, nil
	m.rebuildBase = e.ackedRev
	e.changedLocked()
	e.mu.Unlock()
	err := e.rebuild(r, src)
	e.barrier.Unlock()
	if err != nil {
		e.fault(m, gen, err)
		return
	}
	e.log.Info("replica rebuilding", "replica", m.ID, "source", src.ID)
	e.notify(m.ID, Rebuilding, nil)
}

func (e *Engine) rebuild(r Replica, src *member) error {
	ctx, cancel := context.WithTimeout(e.ctx, e.ioTimeout)
	defer cancel()
	if err := r.Rebuild(ctx, src.Addr, src.ID); err != nil {
		return fmt.Errorf("rebuild from %s: %w", src.ID, err)
	}
	return nil
}

// restartRebuild asks a rebuilding replica whose copier stopped to rebuild again.
func (e *Engine) restartRebuild(m *member, gen uint64) {
	src := e.rebuildSource(m)
	if src == nil {
		return // retried at the next poll
	}
	e.barrier.Lock()
	e.mu.Lock()
	if m.gen != gen || m.state != Rebuilding || src.state != Healthy {
		e.mu.Unlock()
		e.barrier.Unlock()
		return
	}
	r := m.r
	m.rebuildBase = e.ackedRev
	e.mu.Unlock()
	err := e.rebuild(r, src)
	e.barrier.Unlock()
	if err != nil {
		e.fault(m, gen, err)
	}
}

// poll checks a rebuilding replica: done (and holding at least what was acknowledged when
// it began) → healthy; copier failed → rebuild again.
func (e *Engine) poll(m *member) {
	e.mu.Lock()
	r, gen, base, state := m.r, m.gen, m.rebuildBase, m.state
	e.mu.Unlock()
	if state != Rebuilding || r == nil {
		return // faulted since tick chose it (which drops the handle)
	}
	info, err := e.infoOf(e.ctx, r)
	if err != nil {
		if e.ctx.Err() == nil {
			e.fault(m, gen, err)
		}
		return
	}
	e.mu.Lock()
	if m.gen != gen || m.state != Rebuilding || m.removed {
		e.mu.Unlock()
		return
	}
	m.info = info
	switch {
	case info.Size < e.size.Load():
		// The volume grew while it rebuilt and this replica has not: it cannot hold writes
		// past its end, so it leaves the write set until it has grown.
		e.mu.Unlock()
		e.fault(m, gen, smallerErr(info.Size, e.size.Load()))
	case !info.Rebuilding && info.Revision >= base:
		m.state, m.err = Healthy, nil
		e.changedLocked()
		e.mu.Unlock()
		e.notify(m.ID, Healthy, nil)
	case info.Rebuilding && info.RebuildError == "":
		e.mu.Unlock()
	default:
		if info.RebuildError != "" {
			m.err = fmt.Errorf("rebuild failed: %s", info.RebuildError)
		} else {
			m.err = fmt.Errorf("rebuild ended at revision %d, below %d", info.Revision, base)
		}
		err := m.err
		e.mu.Unlock()
		e.log.Warn("replica rebuild stopped; restarting it", "replica", m.ID, "err", err)
		e.restartRebuild(m, gen)
	}
}

// recoverableLocked: no replica is healthy and none is busy.
func (e *Engine) recoverableLocked() bool {
	for _, m := range e.order {
		if m.state == Healthy || m.busy {
			return false
		}
	}
	return len(e.order) > 0
}

// recover runs source selection again after every healthy replica was lost: it needs
// ConsistencyFactor reachable complete replicas (so, with a majority, the freshest is among
// them, exactly as at start), or one that every other replica is rebuilding from
// (soleSource), and admits the freshest as the only healthy one; the others
// then rejoin by rebuilding from it. Writes failed meanwhile, so nothing acknowledged is
// missing from it.
func (e *Engine) recover(members []*member) {
	type cand struct {
		m    *member
		r    Replica
		gen  uint64
		info Info
	}
	var cands []cand
	var infos []Info
	all := map[string]Info{} // every member's, if every one answered
	for _, m := range members {
		e.mu.Lock()
		r, gen, removed := m.r, m.gen, m.removed
		e.mu.Unlock()
		if removed {
			continue
		}
		dialed := false
		if r == nil {
			var err error
			if r, err = e.dial(e.ctx, m); err != nil {
				all = nil
				continue
			}
			dialed = true
		}
		info, err := e.infoOf(e.ctx, r)
		if err == nil {
			e.mu.Lock()
			e.rev = max(e.rev, info.Revision)
			e.mu.Unlock()
			if all != nil {
				all[m.ID] = info
			}
		} else {
			all = nil
		}
		if err != nil || info.Rebuilding || info.Size < e.size.Load() {
			if dialed {
				e.closeHandle(m, r)
			}
			continue
		}
		cands = append(cands, cand{m, r, gen, info})
		infos = append(infos, info)
	}
	i, ok := replica.ChooseSource(infos)
	closeOthers := func(keep int) {
		for j, c := range cands {
			if j != keep && c.r != c.m.r {
				e.closeHandle(c.m, c.r)
			}
		}
	}
	if !ok || (len(cands) < e.cf && !soleSource(all, cands[i].m.ID)) {
		e.log.Debug("no source to recover from", "complete", len(cands), "needed", e.cf)
		closeOthers(-1)
		return
	}
	closeOthers(i)
	c := cands[i]
	if err := e.open(e.ctx, c.r); err != nil {
		if c.r != c.m.r {
			e.closeHandle(c.m, c.r)
		}
		return
	}
	e.barrier.Lock()
	e.mu.Lock()
	if e.closed || c.m.removed || c.m.gen != c.gen || c.m.state == Healthy {
		e.mu.Unlock()
		e.barrier.Unlock()
		return
	}
	old := c.m.r
	c.m.gen++
	c.m.r, c.m.state, c.m.err, c.m.info = c.r, Healthy, nil, c.info
	e.ackedRev = max(e.ackedRev, c.info.Revision)
	e.changedLocked()
	e.mu.Unlock()
	e.barrier.Unlock()
	if old != nil && old != c.r {
		e.closeHandle(c.m, old) // it was rebuilding through another connection
	}
	e.log.Warn("no healthy replica was left; recovered from the freshest", "replica", c.m.ID, "revision", c.info.Revision)
	e.notify(c.m.ID, Healthy, nil)
}
