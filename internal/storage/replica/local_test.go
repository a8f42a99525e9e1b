package replica

import (
	"bytes"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/localsock"
)

// TestLocalLinkServesAsTLSDoes: the target on the replica's node reaches it over the local
// socket with the same protocol and the same rules as over TLS: Authorize is asked about the
// node's CSI plugin, one writer session at a time across both links, and what one link
// writes the other reads.
func TestLocalLinkServesAsTLSDoes(t *testing.T) {
	const size = 4 << 20
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.local = true
	n.create("ns/r1", size)
	var mu sync.Mutex
	var peers []string
	n.tweak = func(s *Server) {
		s.o.Authorize = func(peer, id string) error {
			mu.Lock()
			defer mu.Unlock()
			peers = append(peers, peer)
			if id == "ns/secret" {
				return errors.New("not yours")
			}
			return nil
		}
	}
	n.start()
	ctx := ctxT(t)
	local := n.dialLocal(t).Replica("ns/r1")
	remote := n.dial(t).Replica("ns/r1")

	if _, err := local.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Open(ctx); !errors.Is(err, ErrBusy) {
		t.Fatalf("a second writer over TLS while the local link holds the session: %v, want ErrBusy", err)
	}
	p := make([]byte, 64<<10)
	pattern(p, 7)
	if err := local.WriteAt(ctx, p, 1<<20, 1); err != nil {
		t.Fatal(err)
	}
	for name, r := range map[string]*Client{"local": local, "tls": remote} {
		got := make([]byte, len(p))
		if err := r.ReadAt(ctx, got, 1<<20); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, p) {
			t.Errorf("read over %s: not what the local link wrote", name)
		}
	}
	if info, err := local.Info(ctx); err != nil || !info.Session || info.Revision != 1 {
		t.Fatalf("info over the local link: %+v, %v", info, err)
	}
	if err := local.CloseSession(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Open(ctx); err != nil {
		t.Fatalf("TLS writer after the local one closed its session: %v", err)
	}
	if _, err := n.dialLocal(t).Replica("ns/secret").Info(ctx); !errors.Is(err, ErrForbidden) {
		t.Fatalf("a replica Authorize refuses, over the local link: %v, want ErrForbidden", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Contains(peers, "csi-node:node-a") || !slices.Contains(peers, "test-client") {
		t.Errorf("Authorize was asked about %v, want the local peer csi-node:node-a and the TLS client", peers)
	}
}

// TestLocalLinkRefusals: a client without the token, or one that meant another node's
// server, is refused; a refused connection is closed and serves nothing.
func TestLocalLinkRefusals(t *testing.T) {
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.local = true
	n.create("ns/r1", 1<<20)
	n.tweak = func(s *Server) { s.o.HandshakeTimeout = time.Second }
	n.start()
	ctx := ctxT(t)
	if _, err := DialLocal(ctx, n.localPath(), "node-b"); err == nil || !strings.Contains(err.Error(), `serves node "node-a", not "node-b"`) {
		t.Fatalf("dialing the local socket for another node: %v", err)
	}
	for _, first := range []string{"AUTH wrong\n", "PING\n", "AUTH\n"} {
		c, err := net.Dial("unix", n.localPath())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte(first)); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 512)
		k, _ := c.Read(b)
		if !strings.HasPrefix(string(b[:k]), "ERR refused") {
			t.Errorf("%q as the first line: answered %q, want ERR refused", first, b[:k])
		}
		// A request in the replica protocol after the refusal finds the connection closed.
		_, _ = c.Write(make([]byte, 64))
		if k, err := c.Read(b); err == nil {
			t.Errorf("a refused connection answered %q", b[:k])
		}
		c.Close()
	}
	// A client that says nothing is dropped after the handshake timeout, not kept.
	c, err := net.Dial("unix", n.localPath())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if k, err := c.Read(make([]byte, 16)); err == nil {
		t.Fatalf("a silent client got %d bytes", k)
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("a silent client was not dropped")
	}
}

// TestLocalSocketEndsWithServe: when Serve returns, the local socket's connections are closed
// (a writer session through one ends) and its file is gone; a server started again on the
// same files serves a new socket with a new token.
func TestLocalSocketEndsWithServe(t *testing.T) {
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.local = true
	n.create("ns/r1", 1<<20)
	n.start()
	ctx := ctxT(t)
	token, err := localsock.Token(n.localPath())
	if err != nil {
		t.Fatal(err)
	}
	c := n.dialLocal(t)
	if _, err := c.Replica("ns/r1").Open(ctx); err != nil {
		t.Fatal(err)
	}
	n.stop()
	if _, err := c.Replica("ns/r1").Info(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("a call on the local link after Serve returned: %v, want ErrClosed", err)
	}
	if _, err := os.Stat(n.localPath()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the local socket after Serve returned: %v", err)
	}
	n.start()
	again, err := localsock.Token(n.localPath())
	if err != nil || again == token {
		t.Fatalf("token after a restart: %v (same as before: %t)", err, again == token)
	}
	info, err := n.dialLocal(t).Replica("ns/r1").Open(ctx)
	if err != nil || !info.Dirty {
		t.Fatalf("open over the new socket: %+v, %v (the dropped session leaves the replica dirty)", info, err)
	}
}
