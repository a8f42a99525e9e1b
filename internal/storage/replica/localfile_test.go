package replica

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/localsock"
)

// TestLocalFileIsTheSessionsFile: the descriptor OpenLocalFile returns is the replica's data
// file, read-only: it reads what the writer session wrote before and after it was opened,
// even once the replica's name is gone (the session's file is the one handed out), and it
// cannot be written.
func TestLocalFileIsTheSessionsFile(t *testing.T) {
	const size = 4 << 20
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.local = true
	n.create("ns/r1", size)
	n.start()
	ctx := ctxT(t)
	w := n.dialLocal(t).Replica("ns/r1")
	if _, err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	before := make([]byte, 64<<10)
	pattern(before, 3)
	if err := w.WriteAt(ctx, before, 0, 1); err != nil {
		t.Fatal(err)
	}
	f, err := OpenLocalFile(ctx, n.localPath(), "node-a", "ns/r1")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The name goes; the session's file, and so the descriptor's, stays the replica.
	if err := os.Rename(n.path("ns/r1"), n.path("ns/r1")+".moved"); err != nil {
		t.Fatal(err)
	}
	after := make([]byte, 64<<10)
	pattern(after, 4)
	if err := w.WriteAt(ctx, after, 1<<20, 2); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		off  int64
		want []byte
	}{{0, before}, {1 << 20, after}} {
		got := make([]byte, len(c.want))
		if _, err := f.ReadAt(got, c.off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, c.want) {
			t.Errorf("the file at %d is not what the session wrote", c.off)
		}
	}
	if _, err := f.WriteAt([]byte{1}, 0); err == nil {
		t.Error("the replica's file was handed out writable")
	}
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFD, 0)
	if err != nil || fl&unix.FD_CLOEXEC == 0 {
		t.Errorf("received descriptor not close-on-exec (flags %#x, %v)", fl, err)
	}
}

// TestLocalFileRefusals: the file is handed out only on the local socket, to a peer Authorize
// lets use the replica, as a connection's only request, for a replica the server has, and
// to a client that named the node the socket serves.
func TestLocalFileRefusals(t *testing.T) {
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.local = true
	n.create("ns/r1", 1<<20)
	n.create("ns/secret", 1<<20)
	n.tweak = func(s *Server) {
		s.o.Authorize = func(peer, id string) error {
			if id == "ns/secret" {
				return errors.New("not yours")
			}
			return nil
		}
	}
	n.start()
	ctx := ctxT(t)

	if _, err := OpenLocalFile(ctx, n.localPath(), "node-a", "ns/secret"); !errors.Is(err, ErrForbidden) {
		t.Errorf("a replica Authorize refuses: %v, want ErrForbidden", err)
	}
	if _, err := OpenLocalFile(ctx, n.localPath(), "node-a", "ns/none"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a replica the server lacks: %v, want ErrNotFound", err)
	}
	if _, err := OpenLocalFile(ctx, n.localPath(), "node-b", "ns/r1"); err == nil {
		t.Error("a socket that serves another node was used")
	}
	// Over TLS: refused, and the connection ends.
	if _, err := n.dial(t).Replica("ns/r1").simple(ctx, opFile, 0, 0, nil); !errors.Is(err, ErrForbidden) {
		t.Errorf("opFile over TLS: %v, want ErrForbidden", err)
	}
	// Not the first request of a local connection: refused.
	c := n.dialLocal(t)
	if _, err := c.Replica("ns/r1").Info(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Replica("ns/r1").simple(ctx, opFile, 0, 0, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("opFile after another request: %v, want ErrInvalid", err)
	}
	// A client without the token gets no further than the handshake.
	uc, _, err := localsock.Dial(ctx, n.localPath())
	if err != nil {
		t.Fatal(err)
	}
	uc.Close()
}
