package target

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// grow extends a fake replica, as its node's agent does when the volume is expanded.
func (s *fakeStore) grow(size int64) {
	s.set(func(s *fakeStore) {
		if n := size - int64(len(s.data)); n > 0 {
			s.data = append(s.data, make([]byte, n)...)
		}
	})
}

// growExp extends what the harness expects the volume to hold.
func (h *harness) growExp(size int64) {
	h.exp = append(h.exp, make([]byte, size-int64(len(h.exp)))...)
}

func TestGrowThenWritePastOldEnd(t *testing.T) {
	const newSize = 3 * testSize
	h := newHarness(t, 3)
	h.start(2)
	h.waitAllHealthy()
	h.randomWrites(rand.New(rand.NewPCG(5, 6)), 100)
	past := bytes.Repeat([]byte("grown!!\n"), 2*SectorSize/8)
	if _, err := h.e.WriteAt(past, testSize); err == nil {
		t.Fatal("write past the end succeeded before the volume grew")
	}

	for _, s := range h.stores {
		s.grow(newSize)
	}
	for range 2 { // idempotent
		if err := h.e.Grow(context.Background(), newSize); err != nil {
			t.Fatal(err)
		}
	}
	if got := h.e.Size(); got != newSize {
		t.Fatalf("Size %d after Grow, want %d", got, newSize)
	}
	h.growExp(newSize)
	// Across the old end, past it, and unaligned at the very end.
	for _, w := range []struct {
		p   []byte
		off int64
	}{{past, testSize - SectorSize}, {past, 2 * testSize}, {[]byte("the end"), newSize - 7}} {
		if err := h.write(w.p, w.off); err != nil {
			t.Fatalf("write of %d bytes at %d after Grow: %v", len(w.p), w.off, err)
		}
	}
	if _, err := h.e.WriteAt([]byte{1}, newSize); err == nil {
		t.Fatal("write past the new end succeeded")
	}
	h.checkReadAll()
	got := make([]byte, 1024)
	if n, err := h.e.ReadAt(got, newSize-512); n != 512 || err != io.EOF {
		t.Fatalf("read across the new end: %d, %v; want 512, EOF", n, err)
	}
	h.checkStores(h.stores...)

	// Never shrinks; a smaller or equal size is a no-op, a size not in sectors an error.
	if err := h.e.Grow(context.Background(), testSize); err != nil || h.e.Size() != newSize {
		t.Fatalf("Grow to a smaller size: %v, size %d", err, h.e.Size())
	}
	for _, bad := range []int64{0, -SectorSize, newSize + 100} {
		if err := h.e.Grow(context.Background(), bad); err == nil {
			t.Errorf("Grow(%d) succeeded", bad)
		}
	}
}

func TestGrowRefusedWhileAHealthyReplicaIsSmaller(t *testing.T) {
	h := newHarness(t, 3)
	h.start(2)
	h.waitAllHealthy()
	h.stores[0].grow(2 * testSize)
	h.stores[2].grow(2 * testSize)
	err := h.e.Grow(context.Background(), 2*testSize)
	if err == nil || !strings.Contains(err.Error(), "replica ns/r1 holds 262144 bytes") {
		t.Fatalf("Grow with ns/r1 not grown: %v; want a refusal naming it and its size", err)
	}
	if h.e.Size() != testSize {
		t.Fatalf("size %d after a refused Grow", h.e.Size())
	}
	if _, err := h.e.WriteAt(make([]byte, SectorSize), testSize); err == nil {
		t.Fatal("write past the old end succeeded after a refused Grow")
	}
	// Nobody was faulted for it: the volume is as healthy as before.
	h.waitAllHealthy()
	h.stores[1].grow(2 * testSize)
	if err := h.e.Grow(context.Background(), 2*testSize); err != nil {
		t.Fatal(err)
	}
}

// A replica still rebuilding when the volume grows without it cannot take writes past its
// end: it is faulted, and rejoins (rebuilt over the whole new size) once it has grown.
func TestGrowFaultsASmallerRebuildingReplica(t *testing.T) {
	const newSize = 2 * testSize
	h := newHarness(t, 3)
	gate := make(chan struct{})
	h.stores[0].set(func(s *fakeStore) { s.rev = 7 })
	h.stores[1].set(func(s *fakeStore) { s.rev = 7 })
	h.stores[2].set(func(s *fakeStore) { s.rev, s.gate = 1, gate }) // stale: rebuilt at start, held
	h.start(2)
	h.waitState("ns/r2", Rebuilding)

	h.stores[0].grow(newSize)
	h.stores[1].grow(newSize)
	if err := h.e.Grow(context.Background(), newSize); err != nil {
		t.Fatal(err)
	}
	h.waitState("ns/r2", Faulted)
	if st := h.e.States()["ns/r2"]; st.Err == nil || !strings.Contains(st.Err.Error(), "smaller than the volume") {
		t.Fatalf("ns/r2 faulted with %v", st.Err)
	}
	h.growExp(newSize)
	if err := h.write(bytes.Repeat([]byte{0x5A}, 4*SectorSize), newSize-4*SectorSize); err != nil {
		t.Fatal(err)
	}

	h.stores[2].grow(newSize)
	close(gate)
	h.waitAllHealthy()
	h.checkReadAll()
	h.checkStores(h.stores...)
}

// Grow while writes and reads go on (run with -race): writes inside the old size are not
// disturbed, and a write past the old end succeeds only once Grow has been called.
func TestGrowWhileIOGoesOn(t *testing.T) {
	const newSize = 2 * testSize
	h := newHarness(t, 3)
	h.start(2)
	h.waitAllHealthy()
	for _, s := range h.stores {
		s.grow(newSize)
	}

	const writers = 4
	region := int64(testSize / writers)
	stop := make(chan struct{})
	var growing atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, writers+2)
	exp := make([]byte, newSize)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			base := int64(w) * region
			got := make([]byte, 4096)
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := 1 + rng.IntN(4096)
				off := base + rng.Int64N(region-int64(n))
				p := make([]byte, n)
				for i := range p {
					p[i] = byte(rng.Uint32())
				}
				if _, err := h.e.WriteAt(p, off); err != nil {
					errs <- err
					return
				}
				copy(exp[off:], p) // each writer owns its region
				if err := readBack(h.e, got[:n], off, exp[off:off+int64(n)]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	past := bytes.Repeat([]byte{0xC3}, 8*SectorSize)
	pastOff := int64(testSize + 3*SectorSize)
	pastDone := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(pastDone)
		for {
			attempted := growing.Load()
			_, err := h.e.WriteAt(past, pastOff)
			if err == nil {
				if !attempted {
					errs <- errors.New("a write past the old end succeeded before Grow was called")
				}
				copy(exp[pastOff:], past)
				return
			}
			select {
			case <-stop:
				errs <- errors.New("the write past the old end never succeeded")
				return
			default:
			}
		}
	}()
	growing.Store(true)
	if err := h.e.Grow(context.Background(), newSize); err != nil {
		t.Fatal(err)
	}
	select {
	case <-pastDone:
	case <-time.After(10 * time.Second):
		t.Error("the write past the old end did not succeed within 10s of Grow")
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	h.exp = exp
	h.checkStores(h.stores...)
	h.waitAllHealthy()
}

// checkReadAll reads the whole volume, whatever its size, and compares it with exp.
func (h *harness) checkReadAll() {
	h.t.Helper()
	got := make([]byte, len(h.exp))
	if n, err := h.e.ReadAt(got, 0); n != len(got) || err != nil {
		h.t.Fatalf("ReadAt of %d bytes: %d, %v", len(got), n, err)
	}
	if !bytes.Equal(got, h.exp) {
		h.t.Fatal("read data differs from the acknowledged writes")
	}
}

func readBack(e *Engine, got []byte, off int64, want []byte) error {
	if _, err := e.ReadAt(got, off); err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return errors.New("read back other data than written")
	}
	return nil
}

// Against real replica servers: the volume grows while open, every replica file takes
// writes past the old end, and a replica that was away is rebuilt over the whole new size.
func TestIntegrationGrowAndRebuild(t *testing.T) {
	const newSize = 3 * itSize
	c := newCluster(t)
	c.startEngine()
	c.h.waitAllHealthy()
	c.writers(1, 400, nil)

	// What the agents do: grow each file, then tell the server.
	for i, n := range c.nodes {
		if err := os.Truncate(n.path(c.ids[i]), newSize); err != nil {
			t.Fatal(err)
		}
		if err := n.srv.Resize(c.ids[i], newSize); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.e.Grow(t.Context(), newSize); err != nil {
		t.Fatal(err)
	}
	c.exp = append(c.exp, make([]byte, newSize-itSize)...)
	write := func(seed uint64, off int64, n int) {
		t.Helper()
		p := make([]byte, n)
		_, _ = rand.NewChaCha8([32]byte{byte(seed)}).Read(p)
		if _, err := c.e.WriteAt(p, off); err != nil {
			t.Fatalf("write of %d bytes at %d: %v", n, off, err)
		}
		copy(c.exp[off:], p)
	}
	write(1, itSize-4096, 1<<20)      // across the old end
	write(2, 2*itSize+12345, 300<<10) // past it, unaligned
	write(3, newSize-8192, 8192)      // at the new end
	c.checkRead()
	c.checkFiles() // every replica file holds the grown volume

	// A replica away while the grown range is written is rebuilt over all of it.
	c.nodes[2].stop()
	write(4, 2*itSize, 1<<20)
	c.h.waitState(c.ids[2], Faulted)
	write(5, itSize+SectorSize, 64<<10)
	c.nodes[2].start()
	c.h.waitAllHealthy()
	c.checkRead()
	c.checkFiles()
	if err := c.e.Close(); err != nil {
		t.Fatal(err)
	}
}
