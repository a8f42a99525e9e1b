package target

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/wait"
)

const testSize = 256 << 10

type stateEvent struct {
	id  string
	s   State
	err error
}

type harness struct {
	t      testing.TB
	cl     *fakeCluster
	stores []*fakeStore
	e      *Engine
	exp    []byte // what every acknowledged write says the volume holds
	mu     sync.Mutex
	events []stateEvent
}

func newHarness(t *testing.T, n int) *harness {
	t.Helper()
	h := &harness{t: t, cl: newFakeCluster(), exp: make([]byte, testSize)}
	for i := range n {
		h.stores = append(h.stores, h.cl.add(fmt.Sprintf("ns/r%d", i), testSize))
	}
	return h
}

func (h *harness) options(cf int) Options {
	var ms []Member
	for _, s := range h.stores {
		ms = append(ms, s.member())
	}
	return Options{
		Members:           ms,
		ConsistencyFactor: cf,
		IOTimeout:         200 * time.Millisecond,
		RejoinInterval:    5 * time.Millisecond,
		OnReplicaState: func(id string, s State, err error) {
			h.mu.Lock()
			h.events = append(h.events, stateEvent{id, s, err})
			h.mu.Unlock()
		},
	}
}

func (h *harness) start(cf int, mod ...func(*Options)) {
	h.t.Helper()
	o := h.options(cf)
	for _, f := range mod {
		f(&o)
	}
	e, err := New(context.Background(), o)
	if err != nil {
		h.t.Fatalf("New: %v", err)
	}
	h.e = e
	h.t.Cleanup(func() { _ = e.Close() })
}

func (h *harness) write(p []byte, off int64) error {
	n, err := h.e.WriteAt(p, off)
	if err == nil {
		if n != len(p) {
			h.t.Fatalf("WriteAt returned %d, want %d", n, len(p))
		}
		copy(h.exp[off:], p)
	}
	return err
}

// randomWrites does n writes of random content, aligned and not; all must succeed.
func (h *harness) randomWrites(rng *rand.Rand, n int) {
	h.t.Helper()
	for range n {
		p, off := randomWrite(rng)
		if err := h.write(p, off); err != nil {
			h.t.Fatalf("write of %d at %d: %v", len(p), off, err)
		}
	}
}

func randomWrite(rng *rand.Rand) ([]byte, int64) {
	var n, off int
	if rng.IntN(2) == 0 {
		n = (1 + rng.IntN(16)) * SectorSize
		off = rng.IntN(testSize/SectorSize-16) * SectorSize
	} else {
		n = 1 + rng.IntN(3000)
		off = rng.IntN(testSize - n)
	}
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(rng.Uint32())
	}
	return p, int64(off)
}

func (h *harness) checkRead() {
	h.t.Helper()
	got := make([]byte, testSize)
	if n, err := h.e.ReadAt(got, 0); err != nil || n != testSize {
		h.t.Fatalf("ReadAt: %d, %v", n, err)
	}
	if !bytes.Equal(got, h.exp) {
		h.t.Fatalf("read data differs from the acknowledged writes")
	}
}

func (h *harness) checkStores(stores ...*fakeStore) {
	h.t.Helper()
	for _, s := range stores {
		data, _, _, _ := s.snapshot()
		if !bytes.Equal(data, h.exp) {
			h.t.Fatalf("replica %s differs from the acknowledged writes", s.id)
		}
	}
}

// waitStates waits until cond holds for the engine's states.
func (h *harness) waitStates(what string, cond func(map[string]Status) bool) {
	h.t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		h.e.mu.Lock()
		st := h.e.snapshotStatesLocked()
		ch := h.e.changed
		h.e.mu.Unlock()
		if cond(st) {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			h.t.Fatalf("timed out waiting for %s; states %v", what, st)
		}
	}
}

func (h *harness) waitState(id string, want State) {
	h.t.Helper()
	h.waitStates(id+" "+string(want), func(st map[string]Status) bool { return st[id].State == want })
}

func (h *harness) waitAllHealthy() {
	h.t.Helper()
	h.waitStates("all healthy", func(st map[string]Status) bool {
		for _, s := range st {
			if s.State != Healthy {
				return false
			}
		}
		return true
	})
}

func TestWritesReachEveryReplica(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2)
	h.waitAllHealthy()
	h.randomWrites(rand.New(rand.NewPCG(1, 2)), 500)
	h.checkRead()
	if err := h.e.Flush(); err != nil {
		t.Fatal(err)
	}
	h.checkStores(h.stores...)
	if err := h.e.Close(); err != nil {
		t.Fatal(err)
	}
	for _, s := range h.stores {
		if _, _, dirty, _ := s.snapshot(); dirty {
			t.Errorf("%s still dirty after Close", s.id)
		}
	}
	if _, err := h.e.WriteAt(make([]byte, 512), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("write after Close: %v, want ErrClosed", err)
	}
}

func TestUnalignedWrites(t *testing.T) {
	h := newHarness(t, 2)
	h.start(2)
	h.waitAllHealthy()
	rng := rand.New(rand.NewPCG(3, 4))
	fill := make([]byte, 8192)
	for i := range fill {
		fill[i] = byte(rng.Uint32())
	}
	if err := h.write(fill, 0); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ off, n int }{{1, 1}, {511, 2}, {100, 300}, {700, 1000}, {1024, 100}, {2000, 4000}, {4095, 1}} {
		if err := h.write(bytes.Repeat([]byte{0xAB}, c.n), int64(c.off)); err != nil {
			t.Fatalf("write %v: %v", c, err)
		}
		h.checkRead()
	}
	h.checkStores(h.stores...)
	if _, err := h.e.WriteAt(make([]byte, 2), testSize-1); err == nil {
		t.Error("write past the end succeeded")
	}
}

func TestOverlappingConcurrentWritesApplyInOneOrder(t *testing.T) {
	h := newHarness(t, 3)
	for i, s := range h.stores {
		// Each replica yields differently, so unserialized writes would interleave differently.
		s.set(func(s *fakeStore) {
			s.onWrite = func() {
				for range i * 3 {
					runtime.Gosched()
				}
			}
		})
	}
	h.start(2)
	h.waitAllHealthy()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for range 200 {
				off := int64(rng.IntN(16)) * SectorSize
				p := bytes.Repeat([]byte{byte(rng.Uint32())}, (1+rng.IntN(8))*SectorSize-rng.IntN(2)*7)
				if _, err := h.e.WriteAt(p, off); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	d0, _, _, _ := h.stores[0].snapshot()
	for _, s := range h.stores[1:] {
		if d, _, _, _ := s.snapshot(); !bytes.Equal(d, d0) {
			t.Fatalf("replica %s differs from %s after overlapping writes", s.id, h.stores[0].id)
		}
	}
}

func TestFaultedReplicaIsRebuiltWhileWritesGoOn(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2)
	h.waitAllHealthy()
	rng := rand.New(rand.NewPCG(5, 6))
	h.randomWrites(rng, 300)

	down := h.stores[1]
	down.set(func(s *fakeStore) { s.down = true })
	h.randomWrites(rng, 300) // the first one faults it
	h.waitState(down.id, Faulted)
	if st := h.e.States()[down.id]; !errors.Is(st.Err, errDown) {
		t.Errorf("faulted replica's error = %v, want %v", st.Err, errDown)
	}
	_, _, _, _ = down.snapshot()
	down.mu.Lock()
	writesWhileDown := down.writes
	down.mu.Unlock()

	// It comes back; hold its copier so writes land during the rebuild.
	gate := make(chan struct{})
	down.set(func(s *fakeStore) { s.down, s.gate = false, gate })
	h.waitState(down.id, Rebuilding)
	h.randomWrites(rng, 300)
	if st := h.e.States()[down.id]; st.State != Rebuilding {
		t.Fatalf("state %v before the copier ran", st.State)
	}
	close(gate)
	h.waitState(down.id, Healthy)
	h.randomWrites(rng, 100)
	h.checkRead()
	h.checkStores(h.stores...)
	down.mu.Lock()
	if down.writes <= writesWhileDown {
		t.Error("the rebuilding replica received no writes")
	}
	down.mu.Unlock()

	h.mu.Lock()
	defer h.mu.Unlock()
	var seq []State
	for _, ev := range h.events {
		if ev.id == down.id {
			seq = append(seq, ev.s)
		}
	}
	want := []State{Healthy, Faulted, Rebuilding, Healthy}
	if fmt.Sprint(seq) != fmt.Sprint(want) {
		t.Errorf("state callbacks for %s: %v, want %v", down.id, seq, want)
	}
}

func TestHungReplicaIsFaultedAfterIOTimeout(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2, func(o *Options) { o.IOTimeout = 50 * time.Millisecond })
	h.waitAllHealthy()
	h.stores[2].set(func(s *fakeStore) { s.hang = true })
	h.randomWrites(rand.New(rand.NewPCG(7, 8)), 50)
	h.waitState(h.stores[2].id, Faulted)
	if st := h.e.States()[h.stores[2].id]; !errors.Is(st.Err, context.DeadlineExceeded) {
		t.Errorf("error %v, want a deadline", st.Err)
	}
	h.stores[2].set(func(s *fakeStore) { s.hang = false })
	h.waitAllHealthy()
	h.checkStores(h.stores...)
}

func TestNoQuorum(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2)
	h.waitAllHealthy()
	rng := rand.New(rand.NewPCG(9, 10))
	h.randomWrites(rng, 200)

	for _, s := range h.stores[1:] {
		s.set(func(s *fakeStore) { s.down = true })
	}
	p, off := randomWrite(rng)
	err := h.write(p, off)
	if !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("write with two of three down: %v, want ErrNoQuorum", err)
	}
	if _, err := h.e.WriteAt(make([]byte, 512), 0); !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("next write: %v, want ErrNoQuorum", err)
	}
	if err := h.e.Flush(); !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("flush: %v, want ErrNoQuorum", err)
	}
	// Reads still work from the healthy one, and return only acknowledged data... except
	// the failed write, which may have reached the healthy replica: take it from there.
	d0, _, _, _ := h.stores[0].snapshot()
	copy(h.exp[off:], d0[off:off+int64(len(p))])
	h.checkRead()

	for _, s := range h.stores[1:] {
		s.set(func(s *fakeStore) { s.down = false })
	}
	h.waitAllHealthy()
	h.randomWrites(rng, 100)
	h.checkRead()
	h.checkStores(h.stores...)
}

func TestWaitQuorum(t *testing.T) {
	h := newHarness(t, 3)
	gate := make(chan struct{})
	// An unclean shutdown: everyone dirty, so everyone but the source is rebuilt and
	// writes have no quorum until one rebuild is done.
	for i, s := range h.stores {
		s.set(func(s *fakeStore) { s.dirty, s.rev, s.gate = true, uint64(10+i), gate })
	}
	h.start(2, func(o *Options) { o.QuorumWait = 10 * time.Second })
	if st := h.e.States(); st[h.stores[2].id].State != Healthy || st[h.stores[0].id].State != Rebuilding {
		t.Fatalf("states after unclean start: %v", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	if err := h.e.WaitQuorum(ctx); !errors.Is(err, ErrNoQuorum) {
		t.Errorf("WaitQuorum during rebuild: %v", err)
	}
	cancel()
	done := make(chan error, 1)
	go func() { done <- h.write(make([]byte, 512), 0) }()
	close(gate)
	if err := <-done; err != nil {
		t.Fatalf("write waiting for quorum: %v", err)
	}
	h.waitAllHealthy()
}

func TestStartPicksFreshestAndRebuildsTheRest(t *testing.T) {
	h := newHarness(t, 3)
	rng := rand.New(rand.NewPCG(11, 12))
	for i := range h.exp {
		h.exp[i] = byte(rng.Uint32())
	}
	// r1 is the freshest but dirty (the target died); r0 is stale and clean; r2 is staler.
	h.stores[0].set(func(s *fakeStore) { s.rev = 90; copy(s.data, h.exp[:testSize/2]) })
	h.stores[1].set(func(s *fakeStore) { s.rev, s.dirty = 100, true; copy(s.data, h.exp) })
	h.stores[2].set(func(s *fakeStore) { s.rev = 3 })
	h.start(2)
	st := h.e.States()
	if st["ns/r1"].State != Healthy || st["ns/r0"].State == Healthy || st["ns/r2"].State == Healthy {
		t.Fatalf("states after start: %v", st)
	}
	h.waitAllHealthy()
	h.checkStores(h.stores...)
	h.e.mu.Lock()
	if h.e.rev < 100 {
		t.Errorf("revision counter %d below the source's", h.e.rev)
	}
	h.e.mu.Unlock()
	h.randomWrites(rng, 50)
	h.checkStores(h.stores...)
}

func TestStartAfterCleanCloseNeedsNoRebuild(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2)
	h.waitAllHealthy()
	rng := rand.New(rand.NewPCG(13, 14))
	h.randomWrites(rng, 100)
	if err := h.e.Close(); err != nil {
		t.Fatal(err)
	}
	for _, s := range h.stores {
		s.set(func(s *fakeStore) { s.gate = make(chan struct{}) }) // a rebuild would hang
	}
	h.start(2)
	for id, s := range h.e.States() {
		if s.State != Healthy {
			t.Errorf("%s: %v after a clean restart", id, s.State)
		}
	}
	h.randomWrites(rng, 100)
	h.checkStores(h.stores...)
}

func TestStartWithoutQuorum(t *testing.T) {
	h := newHarness(t, 3)
	h.stores[0].set(func(s *fakeStore) { s.down = true })
	h.stores[1].set(func(s *fakeStore) { s.rebuilding = true })
	_, err := New(context.Background(), h.options(2))
	if !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("New with one complete replica reachable: %v, want ErrNoQuorum", err)
	}
	// Nothing was left holding a session.
	for _, s := range h.stores {
		s.mu.Lock()
		if s.session != 0 {
			t.Errorf("%s: session left open", s.id)
		}
		s.mu.Unlock()
	}
}

func TestFenceAfterHealthyReplicaFails(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2, func(o *Options) { o.RejoinInterval = time.Hour })
	h.waitAllHealthy()
	h.randomWrites(rand.New(rand.NewPCG(15, 16)), 10)
	bad := h.stores[0]
	bad.set(func(s *fakeStore) {
		s.failWrite = func(int64, uint64) error { return errors.New("disk error") }
	})
	if err := h.write(bytes.Repeat([]byte{1}, 512), 0); err != nil {
		t.Fatal(err)
	}
	_, badRev, _, _ := bad.snapshot()
	h.e.mu.Lock()
	engineRev := h.e.rev
	h.e.mu.Unlock()
	for _, s := range h.stores[1:] {
		if _, rev, _, _ := s.snapshot(); rev != engineRev || rev <= badRev+1 {
			t.Errorf("%s at revision %d, faulted replica at %d, engine at %d: no fence", s.id, rev, badRev, engineRev)
		}
	}
}

func TestKilledTargetRestartsFromFreshest(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2)
	h.waitAllHealthy()
	rng := rand.New(rand.NewPCG(17, 18))
	h.randomWrites(rng, 200)

	// Writes in flight when the target dies: r2 gets none of them.
	h.stores[2].set(func(s *fakeStore) { s.hang = true })
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := bytes.Repeat([]byte{byte(g + 1)}, 4096)
			_, _ = h.e.WriteAt(p, int64(g)*4096)
		}()
	}
	kill(h.e)
	wg.Wait()
	h.stores[2].set(func(s *fakeStore) { s.hang = false })

	h.start(2)
	h.waitAllHealthy()
	// Whatever the in-flight writes left, every replica now equals the source.
	d0, _, _, _ := h.stores[0].snapshot()
	copy(h.exp, d0)
	h.checkStores(h.stores...)
	h.randomWrites(rng, 100)
	h.checkRead()
	h.checkStores(h.stores...)
}

// kill drops the engine as a crash would: handles closed, no CloseSession.
func kill(e *Engine) {
	e.mu.Lock()
	e.closed = true
	ms := append([]*member(nil), e.order...)
	e.mu.Unlock()
	e.cancel()
	e.wg.Wait()
	for _, m := range ms {
		e.mu.Lock()
		r := m.r
		e.mu.Unlock()
		e.closeHandle(m, r)
	}
}

func TestReadFailsOverToAnotherReplica(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2, func(o *Options) { o.Members[0].Local = true })
	h.waitAllHealthy()
	h.randomWrites(rand.New(rand.NewPCG(19, 20)), 50)
	h.stores[0].set(func(s *fakeStore) { s.hang = true })
	h.checkRead()
	h.waitState(h.stores[0].id, Faulted)
	h.stores[0].set(func(s *fakeStore) { s.hang = false })
	h.waitAllHealthy()
	h.checkRead()
}

func TestRebuildErrorIsRetried(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2)
	h.waitAllHealthy()
	rng := rand.New(rand.NewPCG(21, 22))
	h.randomWrites(rng, 50)
	r2 := h.stores[2]
	r2.set(func(s *fakeStore) { s.down = true })
	h.randomWrites(rng, 5)
	h.waitState(r2.id, Faulted)

	// r2 returns and rebuilds from r0 or r1; its source dies mid-rebuild.
	gate := make(chan struct{})
	r2.set(func(s *fakeStore) { s.down, s.gate = false, gate })
	h.waitState(r2.id, Rebuilding)
	for _, s := range h.stores[:2] {
		s.set(func(s *fakeStore) { s.hang = true })
	}
	r2.set(func(s *fakeStore) { s.gate = nil })
	close(gate)
	r2.waitFor(t, "a restarted rebuild", func(s *fakeStore) bool { return s.rebuilds >= 3 })
	for _, s := range h.stores[:2] {
		s.set(func(s *fakeStore) { s.hang = false })
	}
	h.waitAllHealthy()
	h.randomWrites(rng, 20)
	h.checkStores(h.stores...)
}

func TestAddAndRemoveMember(t *testing.T) {
	h := newHarness(t, 2)
	h.start(2)
	h.waitAllHealthy()
	rng := rand.New(rand.NewPCG(23, 24))
	h.randomWrites(rng, 100)

	added := h.cl.add("ns/new", testSize)
	if err := h.e.AddMember(added.member()); err != nil {
		t.Fatal(err)
	}
	if err := h.e.AddMember(added.member()); err == nil {
		t.Error("adding a member twice succeeded")
	}
	h.waitState(added.id, Healthy)
	h.randomWrites(rng, 50)
	h.checkStores(append(h.stores, added)...)

	if err := h.e.RemoveMember(h.stores[0].id); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.e.States()[h.stores[0].id]; ok {
		t.Error("removed member still reported")
	}
	before, _, dirty, _ := h.stores[0].snapshot()
	if dirty {
		t.Error("removed member's session was not closed")
	}
	h.randomWrites(rng, 50)
	if after, _, _, _ := h.stores[0].snapshot(); !bytes.Equal(before, after) {
		t.Error("removed member still receives writes")
	}
	h.checkStores(h.stores[1], added)
}

func TestRangeLock(t *testing.T) {
	var l rangeLock
	a := l.lock(0, 10)
	b := l.lock(10, 20) // adjacent: no conflict
	got := make(chan struct{})
	go func() {
		c := l.lock(5, 15)
		close(got)
		l.unlock(c)
	}()
	l.unlock(a)
	select {
	case <-got:
		t.Fatal("overlapping range acquired while held")
	default:
	}
	l.unlock(b)
	<-got
}

func TestRecoverAfterEveryReplicaFailed(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2)
	h.waitAllHealthy()
	rng := rand.New(rand.NewPCG(25, 26))
	h.randomWrites(rng, 200)
	// r2 drops out first and misses writes; then the other two go too.
	h.stores[2].set(func(s *fakeStore) { s.down = true })
	h.randomWrites(rng, 50)
	h.waitState(h.stores[2].id, Faulted)
	for _, s := range h.stores[:2] {
		s.set(func(s *fakeStore) { s.down = true })
	}
	if _, err := h.e.WriteAt(make([]byte, 512), 0); !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("write with every replica down: %v", err)
	}
	if _, err := h.e.ReadAt(make([]byte, 512), 0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("read with every replica down: %v", err)
	}
	// The stale one and one fresh one return: that is a quorum, and the fresh one must be
	// chosen.
	h.stores[2].set(func(s *fakeStore) { s.down = false })
	h.stores[1].set(func(s *fakeStore) { s.down = false })
	h.waitStates("r1 and r2 healthy", func(st map[string]Status) bool {
		return st["ns/r1"].State == Healthy && st["ns/r2"].State == Healthy
	})
	h.checkRead()
	h.stores[0].set(func(s *fakeStore) { s.down = false })
	h.waitAllHealthy()
	h.randomWrites(rng, 50)
	h.checkStores(h.stores...)
}

func TestNoRecoveryWithoutQuorum(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2)
	h.waitAllHealthy()
	h.randomWrites(rand.New(rand.NewPCG(27, 28)), 20)
	for _, s := range h.stores {
		s.set(func(s *fakeStore) { s.down = true })
	}
	_, _ = h.e.WriteAt(make([]byte, 512), 0)
	h.waitStates("all faulted", func(st map[string]Status) bool {
		for _, s := range st {
			if s.State != Faulted {
				return false
			}
		}
		return true
	})
	// One replica alone may be the stale one: it must not become healthy.
	h.stores[0].set(func(s *fakeStore) { s.down = false })
	h.stores[0].waitFor(t, "several election attempts", func(s *fakeStore) bool { return s.nextHandle >= 5 })
	if st := h.e.States()["ns/r0"]; st.State != Faulted {
		t.Fatalf("a lone replica became %v", st.State)
	}
}

// The engine is what blockdev exports (blockdev.Device, restated to keep FUSE out of here).
var _ interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	Flush() error
	Size() int64
} = (*Engine)(nil)

// TestQuorumWaitRidesOutAFailureDuringARebuild: pool agents restarting one after the
// other. One replica was lost and is being rebuilt when a second healthy one fails in the
// middle of a write and of a flush: with QuorumWait, both wait for the rebuild and then
// succeed on the replicas that remain, instead of failing.
func TestQuorumWaitRidesOutAFailureDuringARebuild(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2, func(o *Options) { o.QuorumWait = 10 * time.Second })
	h.waitAllHealthy()
	rng := rand.New(rand.NewPCG(21, 22))
	h.randomWrites(rng, 20)
	first, second := h.stores[0], h.stores[1]
	// The first agent restarts: its replica is faulted by the next write, and comes back
	// to be rebuilt, held by the gate.
	gate := make(chan struct{})
	first.set(func(s *fakeStore) { s.down, s.gate = true, gate })
	h.randomWrites(rng, 5)
	first.set(func(s *fakeStore) { s.down = false })
	wait.Eventually(t, 10*time.Second, "the first replica rebuilding", func(context.Context) (bool, error) {
		if st := h.e.States()[first.id].State; st != Rebuilding {
			return false, fmt.Errorf("%s", st)
		}
		return true, nil
	})
	// The second agent restarts while it rebuilds.
	second.set(func(s *fakeStore) { s.down = true })
	p := make([]byte, 4096)
	for i := range p {
		p[i] = byte(rng.Uint32())
	}
	done := make(chan error, 2)
	go func() { done <- h.write(p, 8192) }()
	go func() { done <- h.e.Flush() }()
	// Without QuorumWait's retry both fail once the second replica is found down: that
	// leaves one healthy replica of the two needed, until the rebuild is let through.
	wait.Eventually(t, 10*time.Second, "the second replica faulted", func(context.Context) (bool, error) {
		if st := h.e.States()[second.id].State; st != Faulted {
			return false, fmt.Errorf("%s", st)
		}
		return true, nil
	})
	close(gate)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("write or flush across the failure: %v", err)
		}
	}
	h.checkRead()
	second.set(func(s *fakeStore) { s.down = false })
	h.waitAllHealthy()
	h.randomWrites(rng, 20)
	h.checkRead()
	h.checkStores(h.stores...)
}
