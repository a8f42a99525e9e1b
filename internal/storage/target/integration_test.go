package target

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/localsock"
	"github.com/crdipc/crdipc/internal/storage/replica"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

const itSize = 4 << 20

// node is a real replica.Server on a loopback address of its own serving files under dir;
// it can be stopped and started again on the same address.
type node struct {
	t      testing.TB
	name   string
	dir    string
	ca     replica.CA
	ip     string // set by the first start
	addr   string
	cancel context.CancelFunc
	done   chan error
	opts   func(*replica.ServerOptions)    // adjusts the server's options, if set
	wrap   func(net.Listener) net.Listener // wraps the server's listener, if set
	local  bool                            // also serves its local socket (localSocket)
	srv    *replica.Server                 // while started
}

// localSocket is where the node serves its local socket when local is set.
func (n *node) localSocket() string { return filepath.Join(n.dir, "replica.sock") }

func (n *node) path(id string) string {
	ns, name, _ := strings.Cut(id, "/")
	return filepath.Join(n.dir, ns, name+".img")
}

func (n *node) create(id string, size int64) {
	n.t.Helper()
	p := n.path(id)
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		n.t.Fatal(err)
	}
	if err := os.WriteFile(p, nil, 0o640); err != nil {
		n.t.Fatal(err)
	}
	if err := os.Truncate(p, size); err != nil {
		n.t.Fatal(err)
	}
}

// nodeIPs numbers the nodes' loopback addresses (127.2.0.1, 127.2.0.2, …). A node restarts
// on the port it had: on 127.0.0.1 an outgoing connection (every client's source address
// there) may have taken that port as its ephemeral one meanwhile, and the restart failed
// with "address already in use".
var nodeIPs atomic.Int32

func (n *node) start() {
	n.t.Helper()
	if n.ip == "" {
		i := nodeIPs.Add(1) - 1
		n.ip = fmt.Sprintf("127.2.%d.%d", i/254, i%254+1)
	}
	cert, err := n.ca.Issue(n.name, []net.IP{net.ParseIP(n.ip)}, nil)
	if err != nil {
		n.t.Fatal(err)
	}
	o := replica.ServerOptions{
		Node: n.name,
		Lookup: func(id string) (replica.Location, error) {
			return replica.Location{Data: n.path(id)}, nil
		},
		TLS: replica.ServerTLSConfig(n.ca.Pool(), cert),
	}
	if n.local {
		ll, err := localsock.Listen("unix", n.localSocket())
		if err != nil {
			n.t.Fatal(err)
		}
		o.Local, o.LocalPeer = ll, "target"
	}
	if n.opts != nil {
		n.opts(&o)
	}
	srv := replica.NewServer(o)
	n.srv = srv
	addr := n.addr
	if addr == "" {
		addr = net.JoinHostPort(n.ip, "0")
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		n.t.Fatal(err)
	}
	n.addr = l.Addr().String()
	if n.wrap != nil {
		l = n.wrap(l)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan error, 1)
	go func() { n.done <- srv.Serve(ctx, l) }()
}

func (n *node) stop() {
	n.t.Helper()
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
		n.t.Fatalf("serve %s did not return", n.name)
	}
}

func (n *node) sha(id string) [32]byte {
	n.t.Helper()
	f, err := os.Open(n.path(id))
	if err != nil {
		n.t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		n.t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

type cluster struct {
	t       testing.TB
	nodes   []*node
	ids     []string
	client  *tls.Config
	members []Member
	// localDials and tlsDials count the connections to member 0, the replica on the
	// target's node, over its local socket and over TLS.
	localDials, tlsDials atomic.Int64
	// fileOpens counts the writer sessions on member 0 after which the engine reads its
	// replica through a descriptor of the file (LocalLink.Reading).
	fileOpens atomic.Int64
	exp       []byte
	e         *Engine
	h         *harness // for waitStates
}

// newCluster starts three replica servers, each with an empty replica of itSize; opts, if
// given, adjusts every server's options. Member 0 is the replica on the target's node,
// reached over its server's local socket as a node plugin reaches it.
func newCluster(t testing.TB, opts ...func(*replica.ServerOptions)) *cluster {
	return newClusterWrapped(t, nil, linkFile, opts...)
}

// link is how the engine reaches member 0, the replica on its node.
type link int

const (
	linkTLS    link = iota // like the others
	linkSocket             // over its server's local socket, reads too (LocalLink.ReadOverSocket)
	linkFile               // over the socket, reads through the replica's file, as a node plugin does
)

func (l link) String() string { return [...]string{"tls", "socket", "file"}[l] }

// newClusterWrapped is newCluster with every server's listener wrapped by wrap, and member
// 0 reached as l says.
func newClusterWrapped(t testing.TB, wrap func(net.Listener) net.Listener, l link, opts ...func(*replica.ServerOptions)) *cluster {
	ca, err := replica.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.Issue("target", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, client: replica.ClientTLSConfig(ca.Pool(), cert), exp: make([]byte, itSize)}
	for i := range 3 {
		n := &node{t: t, name: fmt.Sprintf("node-%d", i), dir: t.TempDir(), ca: ca, wrap: wrap, local: l != linkTLS && i == 0}
		n.opts = func(so *replica.ServerOptions) {
			for _, o := range opts {
				o(so)
			}
		}
		id := fmt.Sprintf("ns/pvc-1-r%d", i)
		n.create(id, itSize)
		n.start()
		t.Cleanup(n.stop)
		c.nodes, c.ids = append(c.nodes, n), append(c.ids, id)
		if !n.local {
			c.members = append(c.members, RemoteMember(id, n.addr, c.client, i == 0))
			continue
		}
		c.members = append(c.members, LocalMember(id, n.addr, c.client, LocalLink{Socket: n.localSocket(), Node: n.name, ReadOverSocket: l == linkSocket, Dialed: func(localErr error) {
			if localErr != nil {
				c.tlsDials.Add(1)
				return
			}
			c.localDials.Add(1)
		}, Reading: func(fileErr error) {
			// A server killed between the session's Open and this request refuses it.
			if fileErr == nil {
				c.fileOpens.Add(1)
			}
		}}))
	}
	return c
}

func (c *cluster) startEngine() {
	c.t.Helper()
	e, err := New(context.Background(), Options{
		Members:           c.members,
		ConsistencyFactor: 2,
		IOTimeout:         5 * time.Second,
		RejoinInterval:    20 * time.Millisecond,
	})
	if err != nil {
		c.t.Fatalf("New: %v", err)
	}
	c.e = e
	c.h = &harness{t: c.t, e: e}
	c.t.Cleanup(func() { _ = e.Close() })
}

// writers runs about n random writes spread over 4 goroutines, each in its own quarter of
// the volume so the expected image is well defined. When half are done, mid runs while the
// writes go on; each goroutine ends with 50 more writes after mid returned.
func (c *cluster) writers(seed uint64, n int, mid func()) {
	c.t.Helper()
	const g = 4
	quarter := int64(itSize / g)
	var wg, half sync.WaitGroup
	half.Add(g)
	midDone, failed := make(chan struct{}), make(chan struct{})
	var failOnce sync.Once
	errs := make(chan error, g)
	for w := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			base := int64(w) * quarter
			for i := 0; i < n/g+50; i++ {
				switch i {
				case n / g / 2:
					half.Done()
				case n / g:
					select {
					case <-midDone:
					case <-failed:
						return
					}
				}
				size := 1 + rng.IntN(8192)
				if rng.IntN(2) == 0 {
					size = (1 + rng.IntN(32)) * SectorSize
				}
				off := base + rng.Int64N(quarter-int64(size))
				if rng.IntN(2) == 0 {
					off = off / SectorSize * SectorSize
				}
				p := make([]byte, size)
				for j := range p {
					p[j] = byte(rng.Uint32())
				}
				if _, err := c.e.WriteAt(p, off); err != nil {
					errs <- fmt.Errorf("write %d of %d bytes at %d: %w", i, size, off, err)
					failOnce.Do(func() { close(failed) })
					if i < n/g/2 {
						half.Done() // so mid still runs and returns
					}
					return
				}
				copy(c.exp[off:], p)
			}
		}()
	}
	go func() {
		half.Wait()
		if mid != nil {
			mid()
		}
		close(midDone)
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		c.t.Fatal(err)
	}
}

func (c *cluster) checkRead() {
	c.t.Helper()
	got := make([]byte, len(c.exp))
	if _, err := c.e.ReadAt(got, 0); err != nil {
		c.t.Fatalf("read: %v", err)
	}
	if !bytes.Equal(got, c.exp) {
		c.t.Fatal("volume read differs from the acknowledged writes")
	}
}

func (c *cluster) checkFiles() {
	c.t.Helper()
	if err := c.e.Flush(); err != nil {
		c.t.Fatalf("flush: %v", err)
	}
	want := sha256.Sum256(c.exp)
	for i, n := range c.nodes {
		if got := n.sha(c.ids[i]); got != want {
			c.t.Errorf("replica file %s on %s: sha256 %x, want %x", c.ids[i], n.name, got[:8], want[:8])
		}
	}
}

func TestIntegrationReplicasOverTLS(t *testing.T) {
	c := newCluster(t)
	c.startEngine()
	c.h.waitAllHealthy()

	// One replica service stops mid-stream: writes go on; it comes back and is rebuilt
	// while they still go on.
	c.writers(1, 2000, func() { c.nodes[2].stop() })
	c.h.waitState(c.ids[2], Faulted)
	c.writers(2, 1000, func() { c.nodes[2].start() })
	c.h.waitAllHealthy()
	c.checkRead()
	c.checkFiles()

	// Two of three stop: the next write fails, and nothing acknowledged is lost when
	// they return.
	c.nodes[1].stop()
	c.nodes[2].stop()
	p := bytes.Repeat([]byte{0xEE}, 4096)
	if _, err := c.e.WriteAt(p, 8192); !errors.Is(err, ErrNoQuorum) {
		t.Fatalf("write with two of three stopped: %v, want ErrNoQuorum", err)
	}
	// The failed write may have reached the surviving replica; the volume shows either
	// the old or the new data, never a mix within a sector.
	got := make([]byte, len(p))
	if _, err := c.e.ReadAt(got, 8192); err != nil {
		t.Fatal(err)
	}
	for s := 0; s < len(got); s += SectorSize {
		if sec := got[s : s+SectorSize]; !bytes.Equal(sec, p[s:s+SectorSize]) && !bytes.Equal(sec, c.exp[8192+s:8192+s+SectorSize]) {
			t.Fatalf("sector %d of the failed write holds neither old nor new data", s/SectorSize)
		}
	}
	copy(c.exp[8192:], got)
	c.nodes[1].start()
	c.nodes[2].start()
	c.h.waitAllHealthy()
	c.checkRead()
	c.writers(3, 400, nil)
	c.checkRead()
	c.checkFiles()

	// The target dies mid-write: a new engine picks the freshest replica and rebuilds the
	// others from it.
	var wg sync.WaitGroup
	type inflight struct {
		off int64
		p   []byte
	}
	var flights []inflight
	started := make(chan struct{}, 8)
	for g := range 8 {
		f := inflight{off: int64(g) * 256 << 10, p: bytes.Repeat([]byte{byte(0x10 + g)}, 64<<10)}
		flights = append(flights, f)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				if _, err := c.e.WriteAt(f.p, f.off); err != nil {
					return
				}
				if i == 0 {
					started <- struct{}{}
				}
			}
		}()
	}
	for range 8 {
		<-started // every writer is past its first write: the kill lands mid-stream
	}
	kill(c.e)
	wg.Wait()

	// The dead target's connections are closed, but a server notices (and finishes the
	// writes it had read) a moment later: the snapshot is taken once no session is left,
	// as the next target's Open would find it.
	var infos []replica.Info
	wait.Eventually(t, 10*time.Second, "no writer session left after the target was killed", func(context.Context) (bool, error) {
		infos = c.infos(t)
		return noSession(infos)
	})
	src, ok := replica.ChooseSource(infos)
	if !ok {
		t.Fatalf("no source among %+v", infos)
	}
	t.Logf("after the kill: %+v; source %s", infos, c.ids[src])

	c.startEngine()
	if st := c.e.States(); st[c.ids[src]].State != Healthy {
		t.Fatalf("freshest replica %s not healthy after restart: %v", c.ids[src], st)
	}
	if err := c.e.WaitQuorum(t.Context()); err != nil {
		t.Fatal(err)
	}
	c.h.waitAllHealthy()
	vol := make([]byte, itSize)
	if _, err := c.e.ReadAt(vol, 0); err != nil {
		t.Fatal(err)
	}
	// Outside the writes in flight nothing changed; inside, each sector is old or new.
	for _, f := range flights {
		for s := int64(0); s < int64(len(f.p)); s += SectorSize {
			o := f.off + s
			if sec := vol[o : o+SectorSize]; !bytes.Equal(sec, f.p[s:s+SectorSize]) && !bytes.Equal(sec, c.exp[o:o+SectorSize]) {
				t.Fatalf("sector at %d holds neither old nor new data", o)
			}
		}
		copy(c.exp[f.off:], vol[f.off:f.off+int64(len(f.p))])
	}
	if !bytes.Equal(vol, c.exp) {
		t.Fatal("volume differs from the acknowledged writes outside the writes in flight")
	}
	c.writers(4, 400, nil)
	c.checkRead()
	c.checkFiles()
	if err := c.e.Close(); err != nil {
		t.Fatal(err)
	}
}

// infos asks every node's server, over a connection of its own, for its replica's Info.
func (c *cluster) infos(t *testing.T) []replica.Info {
	t.Helper()
	var infos []replica.Info
	for i, n := range c.nodes {
		conn, err := replica.Dial(context.Background(), n.addr, c.client)
		if err != nil {
			t.Fatal(err)
		}
		info, err := conn.Replica(c.ids[i]).Info(context.Background())
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		infos = append(infos, info)
	}
	return infos
}

// noSession holds when no replica has a writer session open, and otherwise shows them all.
func noSession(infos []replica.Info) (bool, error) {
	for _, info := range infos {
		if info.Session {
			return false, fmt.Errorf("a session is open: %+v", infos)
		}
	}
	return true, nil
}
