package replica

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// gate is a testBeforeApply hook that holds every chunk until opened, or until its copier's
// context ends (superseded, or the server stopping). held is closed when the first chunk
// is held; copiers counts the distinct copiers that reached the hook.
type gate struct {
	opened   chan struct{}
	held     chan struct{}
	heldOnce sync.Once
	openOnce sync.Once

	mu   sync.Mutex
	ctxs map[context.Context]bool
}

func newGate() *gate {
	return &gate{opened: make(chan struct{}), held: make(chan struct{}), ctxs: map[context.Context]bool{}}
}

func (g *gate) hook(ctx context.Context, _ int64) {
	g.mu.Lock()
	g.ctxs[ctx] = true
	g.mu.Unlock()
	g.heldOnce.Do(func() { close(g.held) })
	select {
	case <-g.opened:
	case <-ctx.Done():
	}
}

func (g *gate) open() { g.openOnce.Do(func() { close(g.opened) }) }

func (g *gate) copiers() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.ctxs)
}

func waitClosed(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// waitRebuilt waits until r is no longer rebuilding, failing on a rebuild error.
func waitRebuilt(t testing.TB, ctx context.Context, r *Client) Info {
	t.Helper()
	var in Info
	wait.Eventually(t, 30*time.Second, "rebuild done", func(context.Context) (bool, error) {
		var err error
		if in, err = r.Info(ctx); err != nil {
			t.Fatal(err)
		}
		if in.RebuildError != "" {
			t.Fatalf("rebuild failed: %s", in.RebuildError)
		}
		return !in.Rebuilding, stillRebuilding(in)
	})
	return in
}

// waitRebuildError waits until r's rebuild failed and returns its state.
func waitRebuildError(t testing.TB, ctx context.Context, r *Client) Info {
	t.Helper()
	var in Info
	wait.Eventually(t, 30*time.Second, "rebuild failed", func(context.Context) (bool, error) {
		var err error
		if in, err = r.Info(ctx); err != nil {
			t.Fatal(err)
		}
		if !in.Rebuilding {
			t.Fatalf("rebuild completed, want it failed: %+v", in)
		}
		if in.RebuildError == "" {
			return false, stillRebuilding(in)
		}
		return true, nil
	})
	return in
}

func (n *testNode) rebuildState(id string) *rebuildState {
	n.srv.mu.Lock()
	defer n.srv.mu.Unlock()
	return n.srv.rebuilds[id]
}

// A restarted target may rebuild from another source than the copier still running from
// its predecessor: that copier must stop before the new copy starts, and leave none of
// its data behind.
func TestRebuildSwitchesSource(t *testing.T) {
	const size = 16 << 20
	pki := newTestPKI(t)
	a, b, d := newTestNode(t, pki, "node-a"), newTestNode(t, pki, "node-b"), newTestNode(t, pki, "node-d")
	for _, n := range []*testNode{a, b, d} {
		n.create("ns/r", size)
	}
	fillFile(t, a.path("ns/r"), 1, Extent{0, size})
	fillFile(t, b.path("ns/r"), 2, Extent{1 << 20, 2 << 20}, Extent{9 << 20, 3 << 20})
	fillFile(t, d.path("ns/r"), 9, Extent{0, size})
	g := newGate()
	d.tweak = func(s *Server) { s.testBeforeApply = g.hook }
	a.start()
	b.start()
	d.start()
	ctx := ctxT(t)
	dst := d.dial(t).Replica("ns/r")
	if _, err := dst.Open(ctx); err != nil {
		t.Fatal(err)
	}

	if err := dst.Rebuild(ctx, a.addr, "ns/r"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, g.held, "the copy from node-a to reach its first chunk")
	in, err := dst.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Rebuilding || in.RebuildSource != a.addr+"/ns/r" {
		t.Fatalf("while copying from node-a: %+v", in)
	}

	// Returns only once node-a's copier stopped (its held chunk ends with its context).
	if err := dst.Rebuild(ctx, b.addr, "ns/r"); err != nil {
		t.Fatal(err)
	}
	in, err = dst.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Rebuilding || in.RebuildSource != b.addr+"/ns/r" || in.RebuildError != "" {
		t.Fatalf("after switching to node-b: %+v", in)
	}
	if m, err := readMeta(d.path("ns/r") + ".meta"); err != nil || !m.Rebuilding {
		t.Fatalf("durable metadata after switching: %+v, %v", m, err)
	}
	g.open()
	in = waitRebuilt(t, ctx, dst)
	if in.RebuildTotal != 5<<20 || in.RebuildDone != in.RebuildTotal || in.RebuildSource != "" {
		t.Fatalf("after the rebuild from node-b: %+v", in)
	}
	if n := g.copiers(); n != 2 {
		t.Fatalf("%d copiers reached the hook, want 2", n)
	}
	if err := dst.CloseSession(ctx); err != nil {
		t.Fatal(err)
	}

	if s, got := fileSHA(t, b.path("ns/r")), fileSHA(t, d.path("ns/r")); s != got {
		t.Fatal("target differs from node-b's replica")
	}
	be, err := b.dial(t).Replica("ns/r").Extents(ctx, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	de, err := dst.Extents(ctx, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(be, de) {
		t.Fatalf("extents differ (node-a's data left behind?):\nnode-b %v\ntarget %v", fmtExtents(be), fmtExtents(de))
	}
}

func TestRebuildSameSourceKeepsCopier(t *testing.T) {
	const size = 8 << 20
	pki := newTestPKI(t)
	a, d := newTestNode(t, pki, "node-a"), newTestNode(t, pki, "node-d")
	a.create("ns/r", size)
	d.create("ns/r", size)
	fillFile(t, a.path("ns/r"), 1, Extent{0, size})
	g := newGate()
	d.tweak = func(s *Server) { s.testBeforeApply = g.hook }
	a.start()
	d.start()
	ctx := ctxT(t)
	dst := d.dial(t).Replica("ns/r")
	if _, err := dst.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := dst.Rebuild(ctx, a.addr, "ns/r"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, g.held, "the copy to reach its first chunk")
	first := d.rebuildState("ns/r")
	if err := dst.Rebuild(ctx, a.addr, "ns/r"); err != nil {
		t.Fatal(err)
	}
	if st := d.rebuildState("ns/r"); st != first {
		t.Fatal("a second rebuild from the same source replaced the running one")
	}
	g.open()
	in := waitRebuilt(t, ctx, dst)
	if in.RebuildDone != size {
		t.Fatalf("after the rebuild: %+v", in)
	}
	if n := g.copiers(); n != 1 {
		t.Fatalf("%d copiers reached the hook, want 1", n)
	}
	if s, got := fileSHA(t, a.path("ns/r")), fileSHA(t, d.path("ns/r")); s != got {
		t.Fatal("target differs from source")
	}
}

// A new writer session may have written the source before asking for the rebuild, without
// sending the replica those writes: the copier must start over even from the same source.
func TestRebuildNewSessionRestartsCopier(t *testing.T) {
	const size = 8 << 20
	pki := newTestPKI(t)
	a, d := newTestNode(t, pki, "node-a"), newTestNode(t, pki, "node-d")
	a.create("ns/r", size)
	d.create("ns/r", size)
	fillFile(t, a.path("ns/r"), 1, Extent{0, size})
	g := newGate()
	d.tweak = func(s *Server) { s.testBeforeApply = g.hook }
	a.start()
	d.start()
	ctx := ctxT(t)
	c1 := d.dial(t)
	if _, err := c1.Replica("ns/r").Open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c1.Replica("ns/r").Rebuild(ctx, a.addr, "ns/r"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, g.held, "the copy to reach its first chunk")
	first := d.rebuildState("ns/r")
	c1.Close()

	dst := d.dial(t).Replica("ns/r")
	wait.Eventually(t, 30*time.Second, "the old session to end", func(context.Context) (bool, error) {
		_, err := dst.Open(ctx)
		if err != nil && !errors.Is(err, ErrBusy) {
			t.Fatal(err)
		}
		return err == nil, err
	})
	if err := dst.Rebuild(ctx, a.addr, "ns/r"); err != nil {
		t.Fatal(err)
	}
	if st := d.rebuildState("ns/r"); st == first || !st.running {
		t.Fatal("a rebuild from a new writer session kept the old copier")
	}
	g.open()
	waitRebuilt(t, ctx, dst)
	if n := g.copiers(); n != 2 {
		t.Fatalf("%d copiers reached the hook, want 2", n)
	}
	if s, got := fileSHA(t, a.path("ns/r")), fileSHA(t, d.path("ns/r")); s != got {
		t.Fatal("target differs from source")
	}
}

func TestInfoSession(t *testing.T) {
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.create("ns/r", 1<<20)
	n.start()
	ctx := ctxT(t)
	obs := n.dial(t).Replica("ns/r")
	check := func(what string, session, dirty bool) {
		t.Helper()
		in, err := obs.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if in.Session != session || in.Dirty != dirty {
			t.Fatalf("%s: session %v dirty %v, want %v %v", what, in.Session, in.Dirty, session, dirty)
		}
	}
	check("before open", false, false)

	c := n.dial(t)
	w := c.Replica("ns/r")
	in, err := w.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Session {
		t.Fatalf("open returned %+v", in)
	}
	check("open", true, true)
	if err := w.CloseSession(ctx); err != nil {
		t.Fatal(err)
	}
	check("after close session", false, false)

	if _, err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	check("open again", true, true)
	c.Close()
	// The server notices the disconnect on its own time.
	wait.Eventually(t, 30*time.Second, "the session to end", func(context.Context) (bool, error) {
		in, err := obs.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return !in.Session, nil
	})
	check("after disconnect", false, true)
}

func TestRebuildFailsWhenSourceChanges(t *testing.T) {
	const size = 8 << 20
	// g holds node-d's copy from node-a; ga holds any copy node-a makes, for good.
	setup := func(t *testing.T) (a *testNode, g, ga *gate, dst, src *Client, ctx context.Context) {
		pki := newTestPKI(t)
		a, d := newTestNode(t, pki, "node-a"), newTestNode(t, pki, "node-d")
		a.create("ns/r", size)
		d.create("ns/r", size)
		fillFile(t, a.path("ns/r"), 1, Extent{0, size})
		g, ga = newGate(), newGate()
		d.tweak = func(s *Server) { s.testBeforeApply = g.hook }
		a.tweak = func(s *Server) { s.testBeforeApply = ga.hook }
		a.start()
		d.start()
		ctx = ctxT(t)
		dst, src = d.dial(t).Replica("ns/r"), a.dial(t).Replica("ns/r")
		if err := dst.Rebuild(ctx, a.addr, "ns/r"); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, g.held, "the copy to reach its first chunk")
		return
	}

	t.Run("source rebuilding", func(t *testing.T) {
		a, g, ga, dst, src, ctx := setup(t)
		// The source starts rebuilding from a third node, and stays at it.
		c := newTestNode(t, a.pki, "node-c")
		c.create("ns/r", size)
		fillFile(t, c.path("ns/r"), 3, Extent{0, 1 << 20})
		c.start()
		if err := src.Rebuild(ctx, c.addr, "ns/r"); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, ga.held, "node-a's own copy to start")
		g.open()
		in := waitRebuildError(t, ctx, dst)
		if !strings.Contains(in.RebuildError, "source started rebuilding") || in.RebuildSource != a.addr+"/ns/r" {
			t.Fatalf("after the source started rebuilding: %+v", in)
		}
	})

	t.Run("writer of the rebuilding replica gone", func(t *testing.T) {
		a, g, _, _, _, ctx := setup(t)
		// Another replica, on node-e, rebuilt while a writer session feeds it, as a target
		// does; the writer drops it (closes its connection) mid-copy.
		e := newTestNode(t, a.pki, "node-e")
		e.create("ns/r", size)
		ge := newGate()
		e.tweak = func(s *Server) { s.testBeforeApply = ge.hook }
		e.start()
		writer := e.dial(t)
		w := writer.Replica("ns/r")
		if _, err := w.Open(ctx); err != nil {
			t.Fatal(err)
		}
		if err := w.Rebuild(ctx, a.addr, "ns/r"); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, ge.held, "the copy to reach its first chunk")
		writer.Close()
		probe := e.dial(t).Replica("ns/r")
		wait.Eventually(t, 10*time.Second, "the writer's session to end with its connection", func(ctx context.Context) (bool, error) {
			in, err := probe.Info(ctx)
			return err == nil && !in.Session, err
		})
		ge.open()
		g.open()
		in := waitRebuildError(t, ctx, probe)
		if !strings.Contains(in.RebuildError, "writer session that fed this replica ended") || !in.Rebuilding {
			t.Fatalf("after its writer dropped it mid-copy: %+v", in)
		}
	})

	t.Run("new writer session on source", func(t *testing.T) {
		_, g, _, dst, src, ctx := setup(t)
		if _, err := src.Open(ctx); err != nil {
			t.Fatal(err)
		}
		g.open()
		in := waitRebuildError(t, ctx, dst)
		if !strings.Contains(in.RebuildError, "new writer session") {
			t.Fatalf("after a new session on the source: %+v", in)
		}
	})
}
