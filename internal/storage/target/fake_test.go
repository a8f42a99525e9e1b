package target

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/storage/replica"
)

var (
	errDown      = errors.New("fake: replica down")
	errBusy      = fmt.Errorf("fake: %w", replica.ErrBusy)
	errNoSession = errors.New("fake: no writer session")
)

// fakeCluster is a set of in-memory replicas addressed like replica servers, so a fake
// rebuild can pull from its source.
type fakeCluster struct {
	mu     sync.Mutex
	stores map[string]*fakeStore // by addr
}

func newFakeCluster() *fakeCluster { return &fakeCluster{stores: map[string]*fakeStore{}} }

func (c *fakeCluster) add(id string, size int64) *fakeStore {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &fakeStore{cluster: c, id: id, addr: "addr-" + id, data: make([]byte, size)}
	c.stores[s.addr] = s
	return s
}

// fakeStore is the durable side of one replica: it outlives handles.
type fakeStore struct {
	cluster *fakeCluster
	id      string
	addr    string

	mu         sync.Mutex
	data       []byte
	rev        uint64
	dirty      bool
	rebuilding bool
	rebuildErr string
	session    int // handle holding the writer session
	nextHandle int
	fresh      map[int64]bool // sectors written since the rebuild began
	copying    bool
	done, tot  int64
	writes     int
	rebuilds   int           // Rebuild calls that started a copier
	changed    chan struct{} // closed and replaced when a copier starts or fails

	// Fault injection, under mu.
	down      bool                              // every call fails
	hang      bool                              // every call blocks until its context ends
	failWrite func(off int64, rev uint64) error // consulted on WriteAt
	gate      chan struct{}                     // a rebuild copier waits on it before copying
	onWrite   func()                            // called (unlocked) inside WriteAt, e.g. to yield
	// snapshots by name; failSnapshot, if set, is consulted on Snapshot; snapGate, if set,
	// holds a Snapshot (unlocked) until it is closed.
	snaps        map[string]fakeSnap
	failSnapshot func(name string) error
	snapGate     chan struct{}
	snapCalls    int
}

type fakeSnap struct {
	data []byte
	info replica.SnapshotInfo
}

func (s *fakeStore) handle() *fakeReplica {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextHandle++
	s.changedLocked()
	return &fakeReplica{s: s, h: s.nextHandle}
}

func (s *fakeStore) member() Member {
	return Member{ID: s.id, Addr: s.addr, Dial: func(context.Context) (Replica, error) {
		s.mu.Lock()
		down := s.down
		s.mu.Unlock()
		if down {
			return nil, errDown
		}
		return s.handle(), nil
	}}
}

func (s *fakeStore) changedLocked() {
	if s.changed != nil {
		close(s.changed)
	}
	s.changed = make(chan struct{})
}

// waitFor waits until cond (called with the store locked) holds.
func (s *fakeStore) waitFor(t *testing.T, what string, cond func(s *fakeStore) bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ok := cond(s)
		if s.changed == nil {
			s.changed = make(chan struct{})
		}
		ch := s.changed
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("%s: timed out waiting for %s", s.id, what)
		}
	}
}

func (s *fakeStore) set(f func(s *fakeStore)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func (s *fakeStore) snapshot() ([]byte, uint64, bool, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.data...), s.rev, s.dirty, s.rebuilding
}

// fakeReplica is one handle (connection) to a store.
type fakeReplica struct {
	s      *fakeStore
	h      int
	mu     sync.Mutex
	closed bool
}

var _ Replica = (*fakeReplica)(nil)

func (r *fakeReplica) ID() string { return r.s.id }

// enter checks faults and returns with the store locked.
func (r *fakeReplica) enter(ctx context.Context) error {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return errors.New("fake: handle closed")
	}
	r.s.mu.Lock()
	if r.s.hang {
		r.s.mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}
	if r.s.down {
		r.s.mu.Unlock()
		return errDown
	}
	return nil
}

func (r *fakeReplica) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.s.mu.Lock()
	if r.s.session == r.h {
		r.s.session = 0 // the connection is gone; Dirty stays
	}
	r.s.mu.Unlock()
	return nil
}

func (r *fakeReplica) infoLocked() Info {
	s := r.s
	return Info{ID: s.id, Size: int64(len(s.data)), Revision: s.rev, Dirty: s.dirty, Rebuilding: s.rebuilding,
		RebuildDone: s.done, RebuildTotal: s.tot, RebuildError: s.rebuildErr}
}

func (r *fakeReplica) Info(ctx context.Context) (Info, error) {
	if err := r.enter(ctx); err != nil {
		return Info{}, err
	}
	defer r.s.mu.Unlock()
	return r.infoLocked(), nil
}

func (r *fakeReplica) Open(ctx context.Context) (Info, error) {
	if err := r.enter(ctx); err != nil {
		return Info{}, err
	}
	defer r.s.mu.Unlock()
	if r.s.session != 0 && r.s.session != r.h {
		return Info{}, errBusy
	}
	r.s.session = r.h
	r.s.dirty = true
	return r.infoLocked(), nil
}

func (r *fakeReplica) WriteAt(ctx context.Context, p []byte, off int64, rev uint64) error {
	if err := r.enter(ctx); err != nil {
		return err
	}
	s := r.s
	if s.session != r.h {
		s.mu.Unlock()
		return errNoSession
	}
	if f := s.failWrite; f != nil {
		if err := f(off, rev); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	if off%SectorSize != 0 || len(p)%SectorSize != 0 || off+int64(len(p)) > int64(len(s.data)) {
		s.mu.Unlock()
		return fmt.Errorf("fake: invalid write of %d at %d", len(p), off)
	}
	hook := s.onWrite
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	copy(s.data[off:], p)
	s.rev = max(s.rev, rev)
	s.writes++
	if s.fresh != nil {
		for sec := off / SectorSize; sec < (off+int64(len(p)))/SectorSize; sec++ {
			s.fresh[sec] = true
		}
	}
	return nil
}

func (r *fakeReplica) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := r.enter(ctx); err != nil {
		return err
	}
	defer r.s.mu.Unlock()
	if off < 0 || off+int64(len(p)) > int64(len(r.s.data)) {
		return fmt.Errorf("fake: invalid read of %d at %d", len(p), off)
	}
	copy(p, r.s.data[off:])
	return nil
}

func (r *fakeReplica) Flush(ctx context.Context) error {
	if err := r.enter(ctx); err != nil {
		return err
	}
	defer r.s.mu.Unlock()
	if r.s.session != r.h {
		return errNoSession
	}
	return nil
}

func (r *fakeReplica) CloseSession(ctx context.Context) error {
	if err := r.enter(ctx); err != nil {
		return err
	}
	defer r.s.mu.Unlock()
	if r.s.session != r.h {
		return errNoSession
	}
	r.s.session = 0
	r.s.dirty = false
	return nil
}

// Rebuild starts a background copy from the source store, skipping sectors written since.
func (r *fakeReplica) Rebuild(ctx context.Context, sourceAddr, sourceID string) error {
	if err := r.enter(ctx); err != nil {
		return err
	}
	s := r.s
	defer s.mu.Unlock()
	s.cluster.mu.Lock()
	src := s.cluster.stores[sourceAddr]
	s.cluster.mu.Unlock()
	if src == nil || src.id != sourceID || src == s {
		return fmt.Errorf("fake: no source %s at %s", sourceID, sourceAddr)
	}
	s.rebuilding = true
	if s.copying {
		return nil
	}
	s.copying, s.rebuildErr, s.done, s.tot = true, "", 0, int64(len(s.data))
	s.fresh = map[int64]bool{}
	s.rebuilds++
	s.changedLocked()
	gate := s.gate
	go s.copyFrom(src, gate)
	return nil
}

func (s *fakeStore) copyFrom(src *fakeStore, gate chan struct{}) {
	if gate != nil {
		<-gate
	}
	const chunk = 4 * SectorSize
	fail := func(msg string) {
		s.mu.Lock()
		s.rebuildErr, s.copying, s.fresh = msg, false, nil
		s.changedLocked()
		s.mu.Unlock()
	}
	for off := int64(0); off < int64(len(s.data)); off += chunk {
		src.mu.Lock()
		if src.down || src.hang {
			src.mu.Unlock()
			fail("source down")
			return
		}
		buf := append([]byte(nil), src.data[off:min(off+chunk, int64(len(src.data)))]...)
		src.mu.Unlock()
		s.mu.Lock()
		if s.down {
			s.mu.Unlock()
			fail("down")
			return
		}
		for i := int64(0); i < int64(len(buf)); i += SectorSize {
			if !s.fresh[(off+i)/SectorSize] {
				copy(s.data[off+i:off+i+SectorSize], buf[i:i+SectorSize])
			}
		}
		s.done = off + int64(len(buf))
		s.mu.Unlock()
	}
	src.mu.Lock()
	srcRev := src.rev
	src.mu.Unlock()
	s.mu.Lock()
	s.rev = max(s.rev, srcRev)
	s.rebuilding, s.copying, s.fresh = false, false, nil
	s.mu.Unlock()
}

func (r *fakeReplica) Snapshot(ctx context.Context, name string) (replica.SnapshotInfo, error) {
	if err := r.enter(ctx); err != nil {
		return replica.SnapshotInfo{}, err
	}
	s := r.s
	s.snapCalls++
	s.changedLocked()
	gate := s.snapGate
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return replica.SnapshotInfo{}, ctx.Err()
		}
	}
	if err := r.enter(ctx); err != nil {
		return replica.SnapshotInfo{}, err
	}
	defer s.mu.Unlock()
	if s.session != r.h {
		return replica.SnapshotInfo{}, errNoSession
	}
	if f := s.failSnapshot; f != nil {
		if err := f(name); err != nil {
			return replica.SnapshotInfo{}, err
		}
	}
	if sn, ok := s.snaps[name]; ok {
		return sn.info, nil
	}
	in := replica.SnapshotInfo{ID: replica.SnapshotID(s.id, name), Name: name, Size: int64(len(s.data)),
		Revision: s.rev, Time: time.Now(), Created: true}
	if s.snaps == nil {
		s.snaps = map[string]fakeSnap{}
	}
	stored := in
	stored.Created = false
	s.snaps[name] = fakeSnap{data: append([]byte(nil), s.data...), info: stored}
	return in, nil
}

func (r *fakeReplica) DeleteSnapshot(ctx context.Context, name string) error {
	if err := r.enter(ctx); err != nil {
		return err
	}
	defer r.s.mu.Unlock()
	delete(r.s.snaps, name)
	return nil
}

// snap returns the data of snapshot name, if the store has it.
func (s *fakeStore) snap(name string) ([]byte, replica.SnapshotInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sn, ok := s.snaps[name]
	return sn.data, sn.info, ok
}
