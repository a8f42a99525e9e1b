package target

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/storage/replica"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

const snapBlock = 4096

// fillBlock writes block number b and sequence number v into buf, then bytes derived from
// both, so a block read back tells which write it holds and whether it is whole.
func fillBlock(buf []byte, b, v uint64) {
	binary.BigEndian.PutUint64(buf[0:], b)
	binary.BigEndian.PutUint64(buf[8:], v)
	x := b<<32 ^ v ^ 0x9E3779B97F4A7C15
	for i := 16; i+8 <= len(buf); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(buf[i:], x)
	}
}

// blockSeq returns the sequence number a block filled by fillBlock for block b holds (0:
// never written); ok is false for a torn or foreign block.
func blockSeq(buf []byte, b uint64) (v uint64, ok bool) {
	if bytes.Equal(buf, make([]byte, len(buf))) {
		return 0, true
	}
	v = binary.BigEndian.Uint64(buf[8:])
	want := make([]byte, len(buf))
	fillBlock(want, b, v)
	return v, bytes.Equal(buf, want)
}

// blockWriters write whole blocks of the volume from several goroutines, each block owned
// by one of them, and record per block the newest write acknowledged.
type blockWriters struct {
	t      *testing.T
	e      *Engine
	seq    atomic.Uint64
	acked  []atomic.Uint64
	wrote  atomic.Int64
	stop   chan struct{}
	errs   chan error
	wg     sync.WaitGroup
	blocks int
}

func startBlockWriters(t *testing.T, e *Engine, size int64, writers int) *blockWriters {
	w := &blockWriters{t: t, e: e, blocks: int(size / snapBlock), stop: make(chan struct{}), errs: make(chan error, writers)}
	w.acked = make([]atomic.Uint64, w.blocks)
	for g := range writers {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 42))
			buf := make([]byte, snapBlock)
			for {
				select {
				case <-w.stop:
					return
				default:
				}
				b := rng.IntN(w.blocks/writers)*writers + g
				v := w.seq.Add(1)
				fillBlock(buf, uint64(b), v)
				if _, err := e.WriteAt(buf, int64(b)*snapBlock); err != nil {
					w.errs <- fmt.Errorf("write %d to block %d: %w", v, b, err)
					return
				}
				w.acked[b].Store(v)
				w.wrote.Add(1)
			}
		}()
	}
	t.Cleanup(w.halt)
	return w
}

// waitWrites waits until n writes were acknowledged in all.
func (w *blockWriters) waitWrites(n int64) {
	w.t.Helper()
	wait.Eventually(w.t, 30*time.Second, fmt.Sprintf("%d acknowledged writes", n), func(context.Context) (bool, error) {
		select {
		case err := <-w.errs:
			w.t.Fatal(err)
		default:
		}
		if got := w.wrote.Load(); got < n {
			return false, fmt.Errorf("%d acknowledged", got)
		}
		return true, nil
	})
}

func (w *blockWriters) ackedNow() []uint64 {
	out := make([]uint64, w.blocks)
	for i := range out {
		out[i] = w.acked[i].Load()
	}
	return out
}

func (w *blockWriters) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
}

// checkSnapshotImage checks that img holds whole blocks only, each at least as new as the
// write acknowledged for it before the snapshot was asked for.
func checkSnapshotImage(t *testing.T, img []byte, before []uint64) {
	t.Helper()
	for b := range before {
		v, ok := blockSeq(img[b*snapBlock:(b+1)*snapBlock], uint64(b))
		if !ok {
			t.Fatalf("block %d of the snapshot is torn", b)
		}
		if v < before[b] {
			t.Fatalf("block %d of the snapshot holds write %d, but write %d was acknowledged before the snapshot", b, v, before[b])
		}
	}
}

func (n *node) snapFiles(id string) []string {
	n.t.Helper()
	m, err := filepath.Glob(n.path(id) + ".snap.*")
	if err != nil {
		n.t.Fatal(err)
	}
	return m
}

// With writers busy on the volume, a snapshot is the same on every replica (sha256) and
// holds every write acknowledged before it was asked for; writes go on after it; taking it
// again changes nothing; deleting it removes the files on every replica.
func TestIntegrationSnapshotUnderConcurrentWrites(t *testing.T) {
	c := newCluster(t)
	c.startEngine()
	c.h.waitAllHealthy()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	w := startBlockWriters(t, c.e, itSize, 4)
	w.waitWrites(300)
	before := w.ackedNow()
	si, err := c.e.Snapshot(ctx, "snap-1")
	if err != nil {
		t.Fatal(err)
	}
	at := w.wrote.Load()
	w.waitWrites(at + 300) // writes resume
	w.halt()

	if !slices.Equal(si.Replicas, c.ids) || si.Size != itSize || si.Time.IsZero() || si.Revision == 0 {
		t.Fatalf("snapshot info %+v; want every replica of %v", si, c.ids)
	}
	var img []byte
	var sums [][32]byte
	for i, n := range c.nodes {
		dataFile, _ := replica.SnapshotFiles(n.path(c.ids[i]), "snap-1")
		b, err := os.ReadFile(dataFile)
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, sha256.Sum256(b))
		img = b
	}
	for i := range sums {
		if sums[i] != sums[0] {
			t.Fatalf("snapshot on %s has sha256 %x, on %s %x", c.nodes[i].name, sums[i][:8], c.nodes[0].name, sums[0][:8])
		}
	}
	checkSnapshotImage(t, img, before)
	// The volume moved on after the snapshot: the later writes are not in it.
	vol := make([]byte, itSize)
	if _, err := c.e.ReadAt(vol, 0); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(vol, img) {
		t.Fatal("the volume equals its snapshot although 300 writes followed it")
	}

	again, err := c.e.Snapshot(ctx, "snap-1")
	if err != nil {
		t.Fatal(err)
	}
	if !again.Time.Equal(si.Time) || again.Revision != si.Revision || !slices.Equal(again.Replicas, si.Replicas) {
		t.Fatalf("repeated snapshot %+v, first %+v", again, si)
	}
	for i, n := range c.nodes {
		dataFile, _ := replica.SnapshotFiles(n.path(c.ids[i]), "snap-1")
		b, err := os.ReadFile(dataFile)
		if err != nil || sha256.Sum256(b) != sums[0] {
			t.Fatalf("repeating the snapshot changed it on %s (%v)", n.name, err)
		}
	}

	for range 2 {
		if err := c.e.DeleteSnapshot(ctx, "snap-1"); err != nil {
			t.Fatalf("DeleteSnapshot: %v", err)
		}
	}
	for i, n := range c.nodes {
		if left := n.snapFiles(c.ids[i]); len(left) != 0 {
			t.Fatalf("snapshot files left on %s: %v", n.name, left)
		}
	}
}

// blockSnapshot makes snapshot name fail on node n (the replica server refuses it: a
// directory stands where its copy goes); the returned func removes the obstacle.
func blockSnapshot(t *testing.T, n *node, id, name string) func() {
	t.Helper()
	dataFile, _ := replica.SnapshotFiles(n.path(id), name)
	if err := os.MkdirAll(filepath.Join(dataFile, "obstacle"), 0o750); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.RemoveAll(dataFile); err != nil {
			t.Fatal(err)
		}
	}
}

// Fewer than ConsistencyFactor replicas take the snapshot: an error, the copies made are
// deleted, no replica is faulted for refusing, and writes go on. With enough, the snapshot
// stands without the one that refused; asked again once that one could take it, the
// existing copies are returned and the new one (of a later moment) is deleted.
func TestIntegrationSnapshotNeedsConsistencyFactor(t *testing.T) {
	c := newCluster(t)
	c.startEngine()
	c.h.waitAllHealthy()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w := startBlockWriters(t, c.e, itSize, 2)
	w.waitWrites(100)
	// A replica faulted and readmitted has a new writer session: a higher epoch.
	epochs := func() []uint64 {
		var out []uint64
		for _, in := range c.infos(t) {
			out = append(out, in.Epoch)
		}
		return out
	}
	epochsBefore := epochs()

	unblock1 := blockSnapshot(t, c.nodes[1], c.ids[1], "s1")
	unblock2 := blockSnapshot(t, c.nodes[2], c.ids[2], "s1")
	_, err := c.e.Snapshot(ctx, "s1")
	if !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("snapshot refused by two of three replicas: %v, want ErrNoQuorum", err)
	}
	if left := c.nodes[0].snapFiles(c.ids[0]); len(left) != 0 {
		t.Fatalf("the copy of a failed snapshot stays on %s: %v", c.nodes[0].name, left)
	}
	at := w.wrote.Load()
	w.waitWrites(at + 100) // writes resume after a failed snapshot
	for id, st := range c.e.States() {
		if st.State != Healthy {
			t.Fatalf("replica %s is %s after refusing a snapshot: %v", id, st.State, st.Err)
		}
	}
	if now := epochs(); !slices.Equal(now, epochsBefore) {
		t.Fatalf("writer-session epochs went from %v to %v: a replica that refused a snapshot was faulted", epochsBefore, now)
	}

	// Two of three suffice.
	unblock1()
	before := w.ackedNow()
	si, err := c.e.Snapshot(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(si.Replicas, c.ids[:2]) {
		t.Fatalf("snapshot held by %v, want %v", si.Replicas, c.ids[:2])
	}
	at = w.wrote.Load()
	w.waitWrites(at + 100)
	w.halt()
	if st := c.e.States()[c.ids[2]]; st.State != Healthy {
		t.Fatalf("the refusing replica is %s: %v", st.State, st.Err)
	}
	if now := epochs(); !slices.Equal(now, epochsBefore) {
		t.Fatalf("writer-session epochs went from %v to %v: a replica that refused a snapshot was faulted", epochsBefore, now)
	}
	var sums [][32]byte
	for i := range 2 {
		dataFile, _ := replica.SnapshotFiles(c.nodes[i].path(c.ids[i]), "s1")
		b, err := os.ReadFile(dataFile)
		if err != nil {
			t.Fatal(err)
		}
		checkSnapshotImage(t, b, before)
		sums = append(sums, sha256.Sum256(b))
	}
	if sums[0] != sums[1] {
		t.Fatal("the two copies of the snapshot differ")
	}

	// Asked again when the third could take it: the name keeps its first content.
	unblock2()
	again, err := c.e.Snapshot(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again.Replicas, c.ids[:2]) || !again.Time.Equal(si.Time) {
		t.Fatalf("repeated snapshot %+v, first %+v", again, si)
	}
	if left := c.nodes[2].snapFiles(c.ids[2]); len(left) != 0 {
		t.Fatalf("a copy of a later moment stays on %s: %v", c.nodes[2].name, left)
	}
}

// While a snapshot is being taken reads go on and writes wait; a write issued meanwhile
// lands after it, on every replica's copy alike.
func TestSnapshotHoldsWritesBackNotReads(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2)
	h.waitAllHealthy()
	p := bytes.Repeat([]byte{1}, 8192)
	if err := h.write(p, 0); err != nil {
		t.Fatal(err)
	}
	before := bytes.Clone(h.exp)
	gate := make(chan struct{})
	landed := make(chan struct{}, 16)
	for _, s := range h.stores {
		s.set(func(s *fakeStore) {
			s.snapGate = gate
			s.onWrite = func() { landed <- struct{}{} }
		})
	}
	done := make(chan error, 1)
	go func() {
		_, err := h.e.Snapshot(context.Background(), "s")
		done <- err
	}()
	for _, s := range h.stores {
		s.waitFor(t, "snapshot asked", func(s *fakeStore) bool { return s.snapCalls == 1 })
	}
	got := make([]byte, len(p))
	if _, err := h.e.ReadAt(got, 0); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("read during a snapshot: %v", err)
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := h.e.WriteAt(bytes.Repeat([]byte{2}, 4096), 0)
		wrote <- err
	}()
	select {
	case <-landed:
		t.Fatal("a write reached a replica while the snapshot was being taken")
	case err := <-wrote:
		t.Fatalf("a write completed while the snapshot was being taken: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("the held write: %v", err)
	}
	for _, s := range h.stores {
		data, _, ok := s.snap("s")
		if !ok || !bytes.Equal(data, before) {
			t.Fatalf("snapshot on %s (present %v) is not the data before the held write", s.id, ok)
		}
	}
}

// A replica whose connection breaks during the snapshot is faulted, as on a write; one that
// refuses is not. Fewer than ConsistencyFactor successes fail the snapshot, delete the
// copies made, and leave writes going.
func TestSnapshotFailures(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2)
	h.waitAllHealthy()
	ctx := context.Background()
	if err := h.write(bytes.Repeat([]byte{7}, 4096), 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := h.e.Snapshot(ctx, "Bad_Name"); !errors.Is(err, replica.ErrInvalid) {
		t.Fatalf("snapshot with a bad name: %v, want ErrInvalid", err)
	}

	// Connection loss: faulted, and the snapshot stands on the two others.
	h.stores[2].set(func(s *fakeStore) { s.failSnapshot = func(string) error { return errDown } })
	si, err := h.e.Snapshot(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(si.Replicas, []string{"ns/r0", "ns/r1"}) {
		t.Fatalf("snapshot held by %v", si.Replicas)
	}
	// Faulted within the call (it may have rejoined since: the events tell).
	if !h.faultedEver("ns/r2") {
		t.Fatal("the replica whose connection failed during the snapshot was not faulted")
	}
	h.stores[2].set(func(s *fakeStore) { s.failSnapshot = nil })
	h.waitAllHealthy()

	// Refused: reported, not faulted.
	refuse := func(string) error { return &replica.RemoteError{Code: 1, Msg: "refused"} }
	h.stores[1].set(func(s *fakeStore) { s.failSnapshot = refuse })
	si, err = h.e.Snapshot(ctx, "s2")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(si.Replicas, []string{"ns/r0", "ns/r2"}) {
		t.Fatalf("snapshot held by %v", si.Replicas)
	}
	if h.faultedEver("ns/r1") {
		t.Fatal("a replica that refused a snapshot was faulted")
	}

	// Too few: an error, nothing left behind, writes go on.
	h.stores[0].set(func(s *fakeStore) { s.failSnapshot = refuse })
	if _, err := h.e.Snapshot(ctx, "s3"); !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("snapshot on one of three with cf 2: %v, want ErrNoQuorum", err)
	}
	for _, s := range h.stores {
		if _, _, ok := s.snap("s3"); ok {
			t.Fatalf("%s keeps a copy of a failed snapshot", s.id)
		}
	}
	if err := h.write(bytes.Repeat([]byte{8}, 4096), 0); err != nil {
		t.Fatalf("write after a failed snapshot: %v", err)
	}
	h.checkStores(h.stores...)

	h.e.Close()
	if _, err := h.e.Snapshot(ctx, "s4"); !errors.Is(err, ErrClosed) {
		t.Fatalf("snapshot of a closed engine: %v", err)
	}
}

// DeleteSnapshot reaches faulted replicas too (dialling them), reports those it cannot
// reach, and is done once it could reach all.
func TestDeleteSnapshotOnEveryMember(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2)
	h.waitAllHealthy()
	ctx := context.Background()
	if _, err := h.e.Snapshot(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	h.stores[2].set(func(s *fakeStore) { s.down = true })
	if err := h.write(bytes.Repeat([]byte{3}, 4096), 0); err != nil {
		t.Fatal(err)
	}
	h.waitState("ns/r2", Faulted)
	err := h.e.DeleteSnapshot(ctx, "s1")
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("ns/r2")) {
		t.Fatalf("delete with a replica down: %v, want an error naming ns/r2", err)
	}
	for _, s := range h.stores[:2] {
		if _, _, ok := s.snap("s1"); ok {
			t.Fatalf("%s keeps the deleted snapshot", s.id)
		}
	}
	// Reachable again, whatever its state by now.
	h.stores[2].set(func(s *fakeStore) { s.down = false })
	if err := h.e.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatalf("delete once every replica is reachable: %v", err)
	}
	if _, _, ok := h.stores[2].snap("s1"); ok {
		t.Fatal("the faulted replica keeps the deleted snapshot")
	}
}

// faultedEver reports whether replica id was ever reported Faulted.
func (h *harness) faultedEver(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ev := range h.events {
		if ev.id == id && ev.s == Faulted {
			return true
		}
	}
	return false
}
