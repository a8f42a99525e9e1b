package replica

import (
	"context"
	"math/rand/v2"
	"os"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// fillFile writes pattern data at the given ranges of path directly, as existing content.
func fillFile(t testing.TB, path string, seed uint64, ranges ...Extent) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i, r := range ranges {
		b := make([]byte, r.Length)
		pattern(b, seed+uint64(i))
		if _, err := f.WriteAt(b, r.Offset); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRebuildWhileWriting(t *testing.T) {
	const size = 64 << 20
	pki := newTestPKI(t)
	a, b := newTestNode(t, pki, "node-a"), newTestNode(t, pki, "node-b")
	a.create("ns/src", size)
	b.create("ns/dst", size)
	// The source: scattered data, one allocated all-zero range, holes elsewhere.
	var srcRanges []Extent
	for off := int64(0); off < 40<<20; off += 3 << 20 {
		srcRanges = append(srcRanges, Extent{off, 1<<20 + 64<<10})
	}
	fillFile(t, a.path("ns/src"), 1, srcRanges...)
	if f, err := os.OpenFile(a.path("ns/src"), os.O_WRONLY, 0); err == nil {
		f.WriteAt(make([]byte, 256<<10), 44<<20)
		f.Close()
	}
	// The target: stale garbage, partly where the source has holes (must become holes).
	fillFile(t, b.path("ns/dst"), 99, Extent{0, 8 << 20}, Extent{46 << 20, 18 << 20})

	// Hold the copier's first chunk until the writer has written a good number of blocks,
	// so the copy certainly meets fresh sectors.
	freshEnough := make(chan struct{})
	var holdOnce sync.Once
	b.tweak = func(s *Server) {
		s.testBeforeApply = func(context.Context, int64) {
			holdOnce.Do(func() {
				select {
				case <-freshEnough:
				case <-time.After(30 * time.Second):
				}
			})
		}
	}
	a.start()
	b.start()
	ctx := ctxT(t)
	src, dst := a.dial(t).Replica("ns/src"), b.dial(t).Replica("ns/dst")
	for _, r := range []*Client{src, dst} {
		if _, err := r.Open(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := src.WriteAt(ctx, make([]byte, 4096), 60<<20, 10); err != nil {
		t.Fatal(err)
	}

	mustBe(t, dst.Rebuild(ctx, b.addr, "ns/dst"), ErrInvalid)
	if err := dst.Rebuild(ctx, a.addr, "ns/src"); err != nil {
		t.Fatal(err)
	}
	if err := dst.Rebuild(ctx, a.addr, "ns/src"); err != nil {
		t.Fatalf("second rebuild while running: %v", err)
	}
	in, err := dst.Info(ctx)
	if err != nil || !in.Rebuilding {
		t.Fatalf("info after rebuild started: %+v, %v", in, err)
	}

	// Writers: like the target, each write goes to both replicas (in either order), with
	// a fresh revision; goroutines own disjoint blocks so their writes never race.
	const writers, blk = 4, 4096
	var rev atomic.Uint64
	rev.Store(10)
	var wrote, wroteDuringRebuild atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			buf := make([]byte, blk)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Blocks in the first 48 MiB, mostly but not only where the source has data.
				blockNo := int64(rng.IntN((48<<20)/blk/writers))*writers + int64(g)
				v := rev.Add(1)
				pattern(buf, v)
				first, second := src, dst
				if i%2 == 1 {
					first, second = dst, src
				}
				if err := first.WriteAt(ctx, buf, blockNo*blk, v); err != nil {
					errs <- err
					return
				}
				if err := second.WriteAt(ctx, buf, blockNo*blk, v); err != nil {
					errs <- err
					return
				}
				if wrote.Add(1) == 200 {
					close(freshEnough)
				}
			}
		}()
	}
	wait.Eventually(t, 60*time.Second, "rebuild done under writes", func(context.Context) (bool, error) {
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
		in, err := dst.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if in.Rebuilding {
			wroteDuringRebuild.Store(wrote.Load())
		}
		return !in.Rebuilding, stillRebuilding(in)
	})
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d writes, %d of them during the rebuild", wrote.Load(), wroteDuringRebuild.Load())
	for _, r := range []*Client{src, dst} {
		if err := r.CloseSession(ctx); err != nil {
			t.Fatal(err)
		}
	}

	si, err := src.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	di, err := dst.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if di.Rebuilding || di.Dirty || di.RebuildError != "" || di.RebuildTotal == 0 || di.RebuildDone != di.RebuildTotal {
		t.Fatalf("target after rebuild: %+v", di)
	}
	if di.Revision != si.Revision {
		t.Fatalf("target revision %d, source %d", di.Revision, si.Revision)
	}
	if s, d := fileSHA(t, a.path("ns/src")), fileSHA(t, b.path("ns/dst")); s != d {
		t.Fatalf("target differs from source: sha256 %s vs %s", d, s)
	}
	se, err := src.Extents(ctx, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	de, err := dst.Extents(ctx, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(se, de) {
		t.Fatalf("holes not preserved:\nsource %v\ntarget %v", fmtExtents(se), fmtExtents(de))
	}
	if de[len(de)-1].Offset != 60<<20 {
		t.Fatalf("last target extent %v, want the one at 60 MiB (garbage beyond 48 MiB must be gone)", de[len(de)-1])
	}
}

func TestRebuildSourceGoesAway(t *testing.T) {
	const size = 32 << 20
	pki := newTestPKI(t)
	a, b := newTestNode(t, pki, "node-a"), newTestNode(t, pki, "node-b")
	a.create("ns/r", size)
	b.create("ns/r", size)
	fillFile(t, a.path("ns/r"), 3, Extent{0, size})
	a.start()
	p := newProxy(t, a.addr)
	// The source vanishes as the first chunk arrives.
	b.tweak = func(s *Server) { s.testBeforeApply = func(context.Context, int64) { p.close() } }
	b.start()
	ctx := ctxT(t)
	dst := b.dial(t).Replica("ns/r")
	if err := dst.Rebuild(ctx, p.addr(), "ns/r"); err != nil {
		t.Fatal(err)
	}
	var in Info
	wait.Eventually(t, 30*time.Second, "rebuild failed", func(context.Context) (bool, error) {
		var err error
		if in, err = dst.Info(ctx); err != nil {
			t.Fatal(err)
		}
		if in.RebuildError == "" {
			return false, stillRebuilding(in)
		}
		return true, nil
	})
	t.Logf("rebuild error: %s", in.RebuildError)
	if !in.Rebuilding || in.RebuildDone >= in.RebuildTotal {
		t.Fatalf("after the source went away: %+v", in)
	}

	// Rebuilding is durable, and a new rebuild from a live source completes.
	b.stop()
	b.tweak = nil
	b.start()
	dst = b.dial(t).Replica("ns/r")
	if in, err := dst.Info(ctx); err != nil || !in.Rebuilding {
		t.Fatalf("after restart: %+v, %v", in, err)
	}
	if err := dst.Rebuild(ctx, a.addr, "ns/r"); err != nil {
		t.Fatal(err)
	}
	wait.Eventually(t, 30*time.Second, "rebuild from a live source done", func(context.Context) (bool, error) {
		in, err := dst.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if in.RebuildError != "" {
			t.Fatal(in.RebuildError)
		}
		return !in.Rebuilding, stillRebuilding(in)
	})
	if s, d := fileSHA(t, a.path("ns/r")), fileSHA(t, b.path("ns/r")); s != d {
		t.Fatal("target differs from source")
	}
}

func TestRebuildThroughput(t *testing.T) {
	size := int64(512 << 20)
	if raceEnabled {
		size = 64 << 20
	}
	pki := newTestPKI(t)
	a, b := newTestNode(t, pki, "node-a"), newTestNode(t, pki, "node-b")
	a.create("ns/r", size)
	b.create("ns/r", size)
	// Half of it data, in 4 MiB extents every other 4 MiB.
	var ranges []Extent
	for off := int64(0); off < size; off += 8 << 20 {
		ranges = append(ranges, Extent{off, 4 << 20})
	}
	fillFile(t, a.path("ns/r"), 5, ranges...)
	a.start()
	b.start()
	ctx := ctxT(t)
	dst := b.dial(t).Replica("ns/r")
	start := time.Now()
	if err := dst.Rebuild(ctx, a.addr, "ns/r"); err != nil {
		t.Fatal(err)
	}
	var in Info
	wait.Eventually(t, 120*time.Second, "rebuild done", func(context.Context) (bool, error) {
		var err error
		if in, err = dst.Info(ctx); err != nil {
			t.Fatal(err)
		}
		if in.RebuildError != "" {
			t.Fatal(in.RebuildError)
		}
		return !in.Rebuilding, stillRebuilding(in)
	})
	el := time.Since(start)
	t.Logf("rebuilt %d MiB of allocated data in %v: %.0f MiB/s", in.RebuildTotal>>20, el.Round(time.Millisecond), float64(in.RebuildTotal)/(1<<20)/el.Seconds())
	if in.RebuildTotal != size/2 {
		t.Fatalf("rebuild total %d", in.RebuildTotal)
	}
	if s, d := fileSHA(t, a.path("ns/r")), fileSHA(t, b.path("ns/r")); s != d {
		t.Fatal("target differs from source")
	}
}
