package replica

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/localsock"
)

var loopback = net.ParseIP("127.0.0.1")

type testPKI struct {
	ca CA
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{ca: ca}
}

func (p *testPKI) cert(t testing.TB, cn string) tls.Certificate {
	t.Helper()
	c, err := p.ca.Issue(cn, []net.IP{loopback}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (p *testPKI) clientTLS(t testing.TB) *tls.Config {
	return ClientTLSConfig(p.ca.Pool(), p.cert(t, "test-client"))
}

// testNode is a Server on 127.0.0.1 serving replicas from dir: id "ns/name" is
// dir/ns/name.img.
type testNode struct {
	t      testing.TB
	name   string
	dir    string
	pki    *testPKI
	addr   string
	srv    *Server
	cancel context.CancelFunc
	done   chan error
	tweak  func(*Server)
	wrap   func(net.Listener) net.Listener // wraps the listener, if set
	local  bool                            // also serve the local socket (localPath)
}

// localPath is where the node serves its local socket when local is set.
func (n *testNode) localPath() string { return filepath.Join(n.dir, "local", "replica.sock") }

// dialLocal connects over the node's local socket.
func (n *testNode) dialLocal(t testing.TB) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := DialLocal(ctx, n.localPath(), n.name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func newTestNode(t testing.TB, pki *testPKI, name string) *testNode {
	n := &testNode{t: t, name: name, dir: t.TempDir(), pki: pki}
	return n
}

func (n *testNode) path(id string) string {
	ns, name, _ := strings.Cut(id, "/")
	return filepath.Join(n.dir, ns, name+".img")
}

// create makes an empty sparse replica file of size bytes.
func (n *testNode) create(id string, size int64) {
	n.t.Helper()
	p := n.path(id)
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		n.t.Fatal(err)
	}
	f, err := os.Create(p)
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		n.t.Fatal(err)
	}
}

func (n *testNode) start() {
	n.t.Helper()
	cert := n.pki.cert(n.t, n.name)
	n.srv = NewServer(ServerOptions{
		Node: n.name,
		Lookup: func(id string) (Location, error) {
			p := n.path(id)
			st, err := os.Stat(p)
			if err != nil {
				return Location{}, err
			}
			return Location{Data: p, Size: st.Size()}, nil
		},
		TLS: ServerTLSConfig(n.pki.ca.Pool(), cert),
	})
	if n.local {
		ll, err := localsock.Listen("unix", n.localPath())
		if err != nil {
			n.t.Fatal(err)
		}
		n.srv.o.Local, n.srv.o.LocalPeer = ll, "csi-node:"+n.name
	}
	if n.tweak != nil {
		n.tweak(n.srv)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		n.t.Fatal(err)
	}
	n.addr = l.Addr().String()
	if n.wrap != nil {
		l = n.wrap(l)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.done = make(chan error, 1)
	go func() { n.done <- n.srv.Serve(ctx, l) }()
	n.t.Cleanup(n.stop)
}

// stop ends Serve and waits for it; a stopped node can start again on the same files.
func (n *testNode) stop() {
	if n.cancel == nil {
		return
	}
	n.cancel()
	n.cancel = nil
	select {
	case err := <-n.done:
		if err != nil {
			n.t.Errorf("serve %s: %v", n.name, err)
		}
	case <-time.After(30 * time.Second):
		n.t.Errorf("serve %s did not return", n.name)
	}
}

func (n *testNode) dial(t testing.TB) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, n.addr, n.pki.clientTLS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// stillRebuilding describes a rebuild in progress, as the reason a wait goes on.
func stillRebuilding(in Info) error {
	if !in.Rebuilding {
		return nil
	}
	return fmt.Errorf("rebuilding: %d of %d bytes copied, error %q", in.RebuildDone, in.RebuildTotal, in.RebuildError)
}

func fileSHA(t testing.TB, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func blocks(t testing.TB, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Blocks * 512
}

// pattern fills b with bytes derived from seed, so content is checkable without storing it.
func pattern(b []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := 0; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i], b[i+1], b[i+2], b[i+3] = byte(x), byte(x>>8), byte(x>>16), byte(x>>24)
		b[i+4], b[i+5], b[i+6], b[i+7] = byte(x>>32), byte(x>>40), byte(x>>48), byte(x>>56)
	}
}

// proxy forwards TCP connections to target until closed; closing it cuts every
// connection, like a node going away.
type proxy struct {
	l      net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

func newProxy(t testing.TB, target string) *proxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l, target: target}
	go p.run()
	t.Cleanup(p.close)
	return p
}

func (p *proxy) addr() string { return p.l.Addr().String() }

func (p *proxy) run() {
	for {
		a, err := p.l.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.target)
		if err != nil {
			a.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			a.Close()
			b.Close()
			return
		}
		p.conns = append(p.conns, a, b)
		p.mu.Unlock()
		go func() { io.Copy(a, b); a.Close() }()
		go func() { io.Copy(b, a); b.Close() }()
	}
}

func (p *proxy) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	p.l.Close()
	for _, c := range p.conns {
		c.Close()
	}
}

func mustBe(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("got error %v, want %v", err, target)
	}
}

func fmtExtents(e []Extent) string { return fmt.Sprint(e) }
