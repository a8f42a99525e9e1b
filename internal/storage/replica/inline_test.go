package replica

import (
	"bytes"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// The reader loop applies small writes itself. A write that a snapshot holds back must not
// hold back the connection's other requests with it: a read sent after it on the same
// connection is answered while the write waits, and the write completes once let go.
func TestReadsGoOnWhileAWriteIsHeldBack(t *testing.T) {
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.create("ns/r1", 1<<20)
	n.start()
	ctx := ctxT(t)
	r := n.dial(t).Replica("ns/r1")
	if _, err := r.Open(ctx); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{7}, 4096)
	if err := r.WriteAt(ctx, data, 0, 1); err != nil {
		t.Fatal(err)
	}

	// What a snapshot holds while it copies.
	n.srv.mu.Lock()
	rep := n.srv.replicas["ns/r1"]
	n.srv.mu.Unlock()
	rep.applyMu.Lock()
	held := true
	defer func() {
		if held {
			rep.applyMu.Unlock()
		}
	}()
	w := r.StartWriteAt(ctx, bytes.Repeat([]byte{8}, 4096), 4096, 2)

	readCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got := make([]byte, 4096)
	if err := r.ReadAt(readCtx, got, 0); err != nil {
		t.Fatalf("a read behind a held-back write: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("read returned other bytes than written")
	}
	rep.applyMu.Unlock()
	held = false
	if err := w.Wait(ctx); err != nil {
		t.Fatalf("the held-back write: %v", err)
	}
	if err := r.ReadAt(ctx, got, 4096); err != nil || got[0] != 8 {
		t.Fatalf("the held-back write was not applied: %v, byte %d", err, got[0])
	}
}

// Writes that reach the server in one TLS record are answered in one: the server writes to
// its socket once for all of them.
func TestWritesOfOneRecordAreAnsweredInOne(t *testing.T) {
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.create("ns/r1", 1<<20)
	var writes atomic.Int64
	n.wrap = func(l net.Listener) net.Listener { return writeCounting{l, &writes} }
	n.start()
	ctx := ctxT(t)
	conn := n.dial(t)
	r := conn.Replica("ns/r1")
	if _, err := r.Open(ctx); err != nil {
		t.Fatal(err)
	}
	// Queue the writes while the connection's writer is taken, so they go out in one flush.
	conn.w.wmu.Lock()
	const k = 3
	var pending []*PendingWrite
	for i := range k {
		pending = append(pending, r.StartWriteAt(ctx, make([]byte, 512), int64(i)*512, uint64(i+1)))
	}
	before := writes.Load()
	conn.w.drain(-1) // releases wmu
	for _, w := range pending {
		if err := w.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := writes.Load() - before; got != 1 {
		t.Fatalf("%d writes sent in one record were answered in %d socket writes, want 1", k, got)
	}
}

type writeCounting struct {
	net.Listener
	n *atomic.Int64
}

func (l writeCounting) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return writeCountingConn{c, l.n}, nil
}

type writeCountingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c writeCountingConn) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}
