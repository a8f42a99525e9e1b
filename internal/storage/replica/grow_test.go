package replica

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// growFile extends a replica file as the node's backend does when its volume is expanded.
func growFile(t testing.TB, n *testNode, id string, size int64) {
	t.Helper()
	if err := os.Truncate(n.path(id), size); err != nil {
		t.Fatal(err)
	}
}

// A writer session open before the growth sees the new size without reopening: Info, and
// reads and writes up to the new end.
func TestResizeServesGrownSizeToOpenSession(t *testing.T) {
	const oldSize, newSize = 1 << 20, 4 << 20
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.create("ns/r1", oldSize)
	n.create("ns/idle", oldSize)
	n.start()
	ctx := ctxT(t)
	r := n.dial(t).Replica("ns/r1")
	if _, err := r.Open(ctx); err != nil {
		t.Fatal(err)
	}
	before := make([]byte, 64<<10)
	pattern(before, 1)
	if err := r.WriteAt(ctx, before, oldSize-int64(len(before)), 1); err != nil {
		t.Fatal(err)
	}
	past := make([]byte, 8192)
	pattern(past, 2)
	mustBe(t, r.WriteAt(ctx, past, 3<<20, 2), ErrInvalid) // not grown yet

	// The server never serves more than the file holds.
	mustBe(t, n.srv.Resize("ns/r1", newSize), ErrInvalid)
	growFile(t, n, "ns/r1", newSize)
	for range 2 { // idempotent
		if err := n.srv.Resize("ns/r1", newSize); err != nil {
			t.Fatal(err)
		}
	}
	in, err := r.Info(ctx)
	if err != nil || in.Size != newSize || !in.Session {
		t.Fatalf("info after resize: %+v, %v; want size %d in the same session", in, err, newSize)
	}
	if err := r.WriteAt(ctx, past, 3<<20, 2); err != nil {
		t.Fatalf("write past the old end: %v", err)
	}
	last := make([]byte, 4096)
	pattern(last, 3)
	if err := r.WriteAt(ctx, last, newSize-4096, 3); err != nil {
		t.Fatalf("write at the new end: %v", err)
	}
	mustBe(t, r.WriteAt(ctx, last, newSize, 4), ErrInvalid)
	for _, w := range []struct {
		off  int64
		want []byte
	}{{oldSize - int64(len(before)), before}, {3 << 20, past}, {newSize - 4096, last}} {
		got := make([]byte, len(w.want))
		if err := r.ReadAt(ctx, got, w.off); err != nil || !bytes.Equal(got, w.want) {
			t.Fatalf("read at %d after the growth: %v (equal %v)", w.off, err, bytes.Equal(got, w.want))
		}
	}
	exts, err := r.Extents(ctx, oldSize, newSize-oldSize)
	if err != nil || len(exts) != 2 || exts[0].Offset != 3<<20 || exts[1].Offset != newSize-4096 {
		t.Fatalf("extents past the old end: %v, %v", exts, err)
	}

	// Never shrinks; nothing to do for a replica nobody has open (Lookup sizes it then).
	mustBe(t, n.srv.Resize("ns/r1", oldSize), ErrInvalid)
	mustBe(t, n.srv.Resize("ns/r1", 0), ErrInvalid)
	if err := n.srv.Resize("ns/idle", newSize); err != nil {
		t.Fatalf("resize of a replica that is not open: %v", err)
	}
	if err := r.CloseSession(ctx); err != nil {
		t.Fatal(err)
	}
}

// A rebuild after the volume grew copies the whole grown size, also when both replicas grow
// while the copy runs.
func TestRebuildAfterGrowthCopiesWholeSize(t *testing.T) {
	const oldSize, midSize, newSize = 2 << 20, 8 << 20, 16 << 20
	pki := newTestPKI(t)
	a, b := newTestNode(t, pki, "node-a"), newTestNode(t, pki, "node-b")
	a.create("ns/src", oldSize)
	b.create("ns/dst", oldSize)
	fillFile(t, a.path("ns/src"), 1, Extent{0, 1 << 20})

	ctx := ctxT(t)
	var src, dst *Client
	// During the copy both replicas grow again, and the source gets data in the range that
	// only then exists: the copier must list and copy that range too.
	var growOnce sync.Once
	grewMidCopy := make(chan error, 1)
	b.tweak = func(s *Server) {
		s.o.RebuildChunk = 256 << 10
		s.testBeforeApply = func(context.Context, int64) {
			growOnce.Do(func() {
				growFile(t, a, "ns/src", newSize)
				growFile(t, b, "ns/dst", newSize)
				err := a.srv.Resize("ns/src", newSize)
				if err == nil {
					err = b.srv.Resize("ns/dst", newSize)
				}
				if err == nil {
					// Written on the source only, as data it holds that the copy must bring.
					fillFile(t, a.path("ns/src"), 3, Extent{12 << 20, 1 << 20})
				}
				grewMidCopy <- err
			})
		}
	}
	a.start()
	b.start()
	src, dst = a.dial(t).Replica("ns/src"), b.dial(t).Replica("ns/dst")
	for _, r := range []*Client{src, dst} {
		if _, err := r.Open(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// The volume grows while both are open; the target writes past the old end on the
	// source only (dst is out of the write set, as a faulted replica is).
	growFile(t, a, "ns/src", midSize)
	growFile(t, b, "ns/dst", midSize)
	for _, g := range []struct {
		n  *testNode
		id string
	}{{a, "ns/src"}, {b, "ns/dst"}} {
		if err := g.n.srv.Resize(g.id, midSize); err != nil {
			t.Fatal(err)
		}
	}
	grown := make([]byte, 1<<20)
	pattern(grown, 2)
	if err := src.WriteAt(ctx, grown, 5<<20, 5); err != nil {
		t.Fatal(err)
	}

	if err := dst.Rebuild(ctx, a.addr, "ns/src"); err != nil {
		t.Fatal(err)
	}
	wait.Eventually(t, 60*time.Second, "rebuild done", func(context.Context) (bool, error) {
		in, err := dst.Info(ctx)
		if err != nil {
			return false, err
		}
		return !in.Rebuilding, stillRebuilding(in)
	})
	if err := <-grewMidCopy; err != nil {
		t.Fatalf("growing during the copy: %v", err)
	}
	in, err := dst.Info(ctx)
	if err != nil || in.Size != newSize || in.RebuildTotal != 3<<20 {
		t.Fatalf("after the rebuild: %+v, %v; want size %d and 3 MiB copied", in, err, newSize)
	}
	if got, want := fileSHA(t, b.path("ns/dst")), fileSHA(t, a.path("ns/src")); got != want {
		t.Fatal("rebuilt replica differs from its source")
	}
}

// A rebuild between replicas of different sizes (one grown, the other not yet) fails
// rather than copying part of the source.
func TestRebuildRefusesSourceOfAnotherSize(t *testing.T) {
	pki := newTestPKI(t)
	a, b := newTestNode(t, pki, "node-a"), newTestNode(t, pki, "node-b")
	a.create("ns/src", 4<<20)
	b.create("ns/dst", 2<<20)
	a.start()
	b.start()
	ctx := ctxT(t)
	dst := b.dial(t).Replica("ns/dst")
	if err := dst.Rebuild(ctx, a.addr, "ns/src"); err != nil {
		t.Fatal(err)
	}
	wait.Eventually(t, 30*time.Second, "the rebuild fails", func(context.Context) (bool, error) {
		in, err := dst.Info(ctx)
		if err != nil {
			return false, err
		}
		if in.RebuildError == "" {
			return false, fmt.Errorf("no rebuild error yet: %+v", in)
		}
		return true, nil
	})
	in, _ := dst.Info(ctx)
	if !in.Rebuilding || !strings.Contains(in.RebuildError, "differs from replica size") {
		t.Fatalf("after a rebuild from a larger source: %+v", in)
	}
}
