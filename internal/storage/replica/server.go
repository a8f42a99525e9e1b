package replica

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/crdipc/crdipc/internal/localsock"
)

// ServerOptions configure a Server.
type ServerOptions struct {
	// Node names this node in errors and logs.
	Node string
	// Lookup maps a replica id ("namespace/name" of the replica) to its files. It is called
	// when a replica is first used by a connection (or a rebuild), so it should be cheap,
	// e.g. answered from an informer cache. Any error means "no such replica".
	Lookup func(id string) (Location, error)
	// Authorize, when set, says whether the peer named peer (the common name of its verified
	// client certificate) may use replica id ("namespace/name"), or snapshot id
	// ("namespace/name@snapshot", see SplitSnapshotID): an error refuses it with
	// ErrForbidden. It is called when a connection first uses the replica or snapshot, so,
	// like Lookup, it should be cheap.
	Authorize func(peer, id string) error
	// TLS is the server configuration, normally ServerTLSConfig(ca, cert). Client
	// certificates are always required and verified against its ClientCAs.
	TLS *tls.Config
	// ClientTLS is used to dial rebuild sources. Nil: TLS's certificate, trusting TLS's
	// ClientCAs (certificates from CA.Issue serve both roles).
	ClientTLS *tls.Config
	// Local, when set, is where Serve also serves the target on this node: a Unix stream
	// socket without TLS that localsock.Listen opened in a directory only the node's
	// privileged components mount (0700, with the token a client must present, from a
	// process of the server's own user). A 1 MiB read costs a third of what it does over
	// TLS on loopback (BenchmarkRead1MiB), and the peer is named by the kernel rather than
	// by a certificate. Everything else is as on Serve's listener: sessions, fencing,
	// rebuilds, snapshots. Serve closes it when it returns. Opened before Serve runs (as
	// the TCP listener is), it queues connections meanwhile rather than refusing them.
	Local *localsock.Listener
	// LocalPeer is who a connection on Local is to Authorize: the common name of this
	// node's CSI plugin, the only client that mounts the socket's directory.
	LocalPeer string
	// Logger; the zero value discards.
	Logger logr.Logger
	// HandshakeTimeout bounds a TLS handshake (default 10s).
	HandshakeTimeout time.Duration
	// PeerTimeout bounds each request the rebuild copier makes to its source (default 30s).
	PeerTimeout time.Duration
	// RebuildChunk is the size of the pieces a rebuild copies (default 1 MiB, at most
	// MaxPayload); RebuildParallel is how many are in flight (default 8).
	RebuildChunk    int
	RebuildParallel int
}

// Server serves the replica files of one node to authenticated peers.
type Server struct {
	o         ServerOptions
	log       logr.Logger
	tlsConf   *tls.Config
	clientTLS *tls.Config

	mu       sync.Mutex
	served   bool
	closing  bool
	addr     string          // of the listener, to refuse rebuilding a replica from itself
	ctx      context.Context // ends when Serve's context ends; copiers run under it
	replicas map[string]*replica
	rebuilds map[string]*rebuildState
	conns    map[*serverConn]struct{}
	// snapLocks serialize taking and deleting snapshots, by replica id.
	snapLocks map[string]*refMutex
	// noSpace holds, by replica id, the last write that failed for a full file system
	// while none has succeeded since (Info.NoSpace). A sync.Map: every write looks it up.
	noSpace sync.Map

	connWG   sync.WaitGroup
	copierWG sync.WaitGroup

	// testBeforeApply, if set, runs before the copier applies each chunk; ctx is the
	// copier's, ended when it is superseded or the server stops.
	testBeforeApply func(ctx context.Context, off int64)
	// testNoReflink makes snapshots take the sparse copy even where FICLONE works.
	testNoReflink bool
}

// NewServer returns a server; nothing happens until Serve.
func NewServer(o ServerOptions) *Server {
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 10 * time.Second
	}
	if o.PeerTimeout <= 0 {
		o.PeerTimeout = 30 * time.Second
	}
	if o.RebuildChunk <= 0 {
		o.RebuildChunk = 1 << 20
	}
	o.RebuildChunk = min(o.RebuildChunk, MaxPayload)
	if o.RebuildParallel <= 0 {
		o.RebuildParallel = 8
	}
	s := &Server{
		o:         o,
		log:       o.Logger.WithValues("node", o.Node),
		replicas:  map[string]*replica{},
		rebuilds:  map[string]*rebuildState{},
		conns:     map[*serverConn]struct{}{},
		snapLocks: map[string]*refMutex{},
	}
	if o.TLS != nil {
		s.tlsConf = o.TLS.Clone()
		// Mutual TLS is the contract whatever the caller passed.
		s.tlsConf.ClientAuth = tls.RequireAndVerifyClientCert
		s.tlsConf.MinVersion = max(s.tlsConf.MinVersion, tls.VersionTLS13)
		s.tlsConf.NextProtos = []string{ALPN}
	}
	s.clientTLS = o.ClientTLS
	if s.clientTLS == nil && o.TLS != nil {
		s.clientTLS = &tls.Config{
			MinVersion:           tls.VersionTLS13,
			Certificates:         o.TLS.Certificates,
			GetClientCertificate: clientCertFromServer(o.TLS),
			RootCAs:              o.TLS.ClientCAs,
			NextProtos:           []string{ALPN},
		}
	}
	return s
}

// clientCertFromServer presents the server's certificate when it comes from
// GetCertificate rather than Certificates; nil otherwise.
func clientCertFromServer(c *tls.Config) func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	if len(c.Certificates) > 0 || c.GetCertificate == nil {
		return nil
	}
	return func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return c.GetCertificate(&tls.ClientHelloInfo{})
	}
}

// Serve accepts connections on l until ctx ends, then closes l and every connection, stops
// rebuild copiers (they report the cancellation as their error) and closes the replica
// files. It returns nil when ctx ended, else the accept error. A Server serves once.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	if s.tlsConf == nil || s.o.Lookup == nil {
		return errors.New("replica server needs TLS and Lookup")
	}
	ctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	if s.served {
		s.mu.Unlock()
		cancel()
		return errors.New("replica server already served")
	}
	s.served, s.ctx, s.addr = true, ctx, l.Addr().String()
	s.mu.Unlock()

	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	s.log.Info("serving replicas", "addr", l.Addr().String())
	if ll := s.o.Local; ll != nil {
		s.log.Info("serving replicas to this node's target", "socket", ll.Addr().String())
		go s.acceptLocal(ll)
		// Closed before Serve returns, so that its socket file is gone by then.
		defer ll.Close()
	}
	var err error
	for {
		nc, aerr := l.Accept()
		if aerr != nil {
			if ctx.Err() == nil {
				err = fmt.Errorf("accepting replica connections: %w", aerr)
			}
			break
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			deadPeerTCP(tc)
		}
		s.start(newServerConn(s, tls.Server(nc, s.tlsConf)))
	}
	cancel()
	l.Close()
	s.shutdown()
	return err
}

// acceptLocal serves the connections of the local socket l until l is closed.
func (s *Server) acceptLocal(l *localsock.Listener) {
	for {
		nc, err := l.AcceptUnix()
		if err != nil {
			return
		}
		c := newServerConn(s, nc)
		c.localToken = l.Token
		s.start(c)
	}
}

// start serves c, unless the server is shutting down.
func (s *Server) start(c *serverConn) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		c.nc.Close()
		return
	}
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	s.mu.Unlock()
	go c.serve()
}

func (s *Server) shutdown() {
	s.mu.Lock()
	s.closing = true
	for c := range s.conns {
		c.shutdown()
	}
	s.mu.Unlock()
	s.connWG.Wait()
	s.copierWG.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, r := range s.replicas {
		r.close()
		delete(s.replicas, id)
	}
}

// acquire returns replica id, opening it on first use. Each acquire is paired with a
// release; the file is closed when nobody uses it, so a deleted replica's space is freed.
func (s *Server) acquire(id string) (*replica, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return nil, ErrClosed
	}
	if r := s.replicas[id]; r != nil {
		if !r.snap || !r.deleted() {
			r.refs++
			return r, nil
		}
		// The snapshot was deleted (and maybe taken again) since it was opened: its
		// users keep the old file, new ones get what exists now.
		r.detached = true
		delete(s.replicas, id)
	}
	base, snapName, isSnap := SplitSnapshotID(id)
	if isSnap {
		if err := ValidateSnapshotName(snapName); err != nil {
			return nil, err
		}
	}
	loc, err := s.o.Lookup(base)
	if err != nil {
		return nil, fmt.Errorf("no replica %s on node %s: %v: %w", base, s.o.Node, err, ErrNotFound)
	}
	var r *replica
	if isSnap {
		r, err = openSnapshot(id, snapName, loc)
	} else {
		r, err = openReplica(id, loc)
	}
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, fmt.Errorf("no replica %s on node %s: %w", id, s.o.Node, err)
		}
		return nil, err
	}
	r.refs = 1
	s.replicas[id] = r
	return r, nil
}

// Resize tells the server that replica id has grown to size bytes: its data file (which
// the node's backend has grown already) must hold at least that much. A replica that is
// open — by a writer session, readers, a rebuild — serves the new size from now on, with
// no reopening; one that is not open is sized by Lookup when it is next opened, and then
// Resize has nothing to do. A size below the current one is refused: replicas never shrink.
func (s *Server) Resize(id string, size int64) error {
	if size <= 0 {
		return fmt.Errorf("resizing replica %s to %d bytes: size must be positive: %w", id, size, ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return ErrClosed
	}
	r := s.replicas[id]
	if r == nil {
		return nil
	}
	if r.snap {
		return fmt.Errorf("snapshot %s never grows: %w", id, ErrInvalid)
	}
	if err := r.grow(size); err != nil {
		return err
	}
	s.log.Info("replica resized", "replica", id, "size", size)
	return nil
}

// release drops a reference; the last one closes the file. A replica written since its
// last flush is flushed first: the data stays in the file (the page cache outlives the
// writer's disconnect and this server's restart), so reopening it at its older durable
// revision would make it look staler than it is, and a replica that missed those writes
// as fresh or fresher. Under mu, so no acquire reopens it before the revision is durable.
func (s *Server) release(r *replica) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r.refs--
	if r.refs == 0 && r.detached {
		if err := r.close(); err != nil {
			s.log.Error(err, "closing replica file", "replica", r.id)
		}
		return
	}
	if r.refs == 0 && s.replicas[r.id] == r {
		delete(s.replicas, r.id)
		if !r.snap && r.rev.Load() > r.durable().Revision && !r.deleted() {
			if err := r.flush(nil); err != nil {
				s.log.Error(err, "flushing replica before closing it", "replica", r.id)
			}
		}
		if err := r.close(); err != nil {
			s.log.Error(err, "closing replica file", "replica", r.id)
		}
	}
}

// serverConn is one client connection. A reader loop decodes requests. A small write it
// applies itself (no goroutine hand-off, which costs more than the write), and it answers
// every write read from one burst of the stream in one flush; any other request runs in a
// goroutine of its own (bounded by sem), which sends its response itself. Responses go out
// through w, which batches whatever is queued into one TLS record.
type serverConn struct {
	s    *Server
	nc   net.Conn
	peer string // the common name of the client's certificate, once the handshake is done
	// localToken is set for a connection of the local socket: the token its client must
	// present (localsock.Admit) instead of a certificate.
	localToken string

	w    *frameWriter[outFrame]
	done chan struct{}
	once sync.Once
	sem  chan struct{}
	hwg  sync.WaitGroup

	mu       sync.Mutex
	replicas map[string]*replica // acquired by this connection, released when it ends
}

type outFrame struct {
	h       respHeader
	payload []byte
	buf     *[]byte // returned to the pool once written
}

// maxConnRequests bounds the requests a connection runs at once; beyond it the reader
// stops reading, which pushes back on the client through TCP.
const maxConnRequests = 64

// maxInlineWrite is the largest write the reader loop applies itself. A larger one runs in
// a goroutine, so that copying it into the page cache overlaps reading the next request.
// While the kernel throttles a writer (too much dirty memory) an inline write holds the
// connection's next requests too, reads included; the volume's disk is then busy anyway.
const maxInlineWrite = 64 << 10

func newServerConn(s *Server, nc net.Conn) *serverConn {
	c := &serverConn{
		s:        s,
		nc:       nc,
		done:     make(chan struct{}),
		sem:      make(chan struct{}, maxConnRequests),
		replicas: map[string]*replica{},
	}
	c.w = newFrameWriter(nc, writeOutFrame, func(f outFrame) { putBuf(f.buf) }, func(error) { c.shutdown() })
	return c
}

func (c *serverConn) shutdown() {
	c.once.Do(func() {
		close(c.done)
		c.w.close(net.ErrClosed)
		c.nc.Close()
	})
}

func (c *serverConn) serve() {
	defer c.s.connWG.Done()
	log, err := c.admit()
	if err != nil {
		c.shutdown()
		c.s.forget(c)
		return
	}
	log.V(1).Info("connection accepted")

	err = c.readLoop()
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		log.Info("replica connection failed", "err", err.Error())
	}
	c.shutdown()
	c.hwg.Wait()
	// A writer session ends with its connection; Dirty stays set, as the writer did not
	// close it cleanly.
	c.mu.Lock()
	for _, r := range c.replicas {
		if r.owner.CompareAndSwap(c, nil) {
			log.Info("writer session ended by disconnect", "replica", r.id)
		}
		c.s.release(r)
	}
	c.replicas = nil
	c.mu.Unlock()
	c.s.forget(c)
}

// admit authenticates the connection's peer: the TLS handshake and its client certificate,
// or, on the local socket, the kernel's word on its user and the token. It returns the
// connection's logger, naming the peer.
func (c *serverConn) admit() (logr.Logger, error) {
	if c.localToken != "" {
		log := c.s.log.WithValues("peer", "local socket")
		if err := localsock.Admit(c.nc.(*net.UnixConn), c.localToken, c.s.o.Node, c.s.o.HandshakeTimeout); err != nil {
			// Only a root process of this node gets here: worth a line at the default level.
			log.Info("refused a client of the local socket", "reason", err.Error())
			return log, err
		}
		c.peer = c.s.o.LocalPeer
		return log.WithValues("peerName", c.peer), nil
	}
	log := c.s.log.WithValues("peer", c.nc.RemoteAddr().String())
	tc := c.nc.(*tls.Conn)
	tc.SetDeadline(time.Now().Add(c.s.o.HandshakeTimeout))
	if err := tc.Handshake(); err != nil {
		log.V(1).Info("tls handshake failed", "err", err.Error())
		return log, err
	}
	tc.SetDeadline(time.Time{})
	c.peer = tc.ConnectionState().PeerCertificates[0].Subject.CommonName
	return log.WithValues("peerName", c.peer), nil
}

func (s *Server) forget(c *serverConn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

func (c *serverConn) readLoop() error {
	br := bufio.NewReaderSize(c.nc, 64<<10)
	var hb [4 + reqHeaderLen]byte
	idb := make([]byte, maxIDLen)
	// Responses of the writes applied here, sent once no further request is buffered (the
	// next read could wait), so that a burst of writes is answered in one flush.
	var answered []outFrame
	first := true // no request was read before this one
	for {
		if len(answered) > 0 && !frameBuffered(br) {
			c.send(answered...)
			clear(answered)
			answered = answered[:0]
		}
		if _, err := io.ReadFull(br, hb[:]); err != nil {
			return err
		}
		total := int64(binary.BigEndian.Uint32(hb[:4]))
		if total < reqHeaderLen {
			return fmt.Errorf("frame of %d bytes is shorter than a header", total)
		}
		var h reqHeader
		h.decode(hb[4:])
		rest := total - reqHeaderLen
		if h.idLen > maxIDLen || int64(h.idLen) > rest {
			return fmt.Errorf("bad replica id length %d", h.idLen)
		}
		if _, err := io.ReadFull(br, idb[:h.idLen]); err != nil {
			return err
		}
		id := string(idb[:h.idLen])
		n := rest - int64(h.idLen)
		if n > MaxPayload {
			// Skip the payload so the stream stays in sync, and refuse the request.
			if _, err := io.CopyN(io.Discard, br, n); err != nil {
				return err
			}
			c.send(errorFrame(h.id, fmt.Errorf("payload of %d bytes exceeds %d: %w", n, MaxPayload, ErrTooLarge)))
			continue
		}
		var buf *[]byte
		if n > 0 {
			buf = getBuf(int(n))
			if _, err := io.ReadFull(br, *buf); err != nil {
				putBuf(buf)
				return err
			}
		}
		if h.op == opFile && first && c.localToken != "" {
			putBuf(buf)
			// The connection ends with the answer: see sendFile.
			return c.sendFile(h, id)
		}
		first = false
		if h.op == opWrite && n <= maxInlineWrite {
			if f, ok := c.handleInline(h, id, buf); ok {
				answered = append(answered, f)
				continue
			}
		}
		if len(answered) > 0 {
			// Not held while this request waits for a free handler.
			c.send(answered...)
			clear(answered)
			answered = answered[:0]
		}
		select {
		case c.sem <- struct{}{}:
		case <-c.done:
			putBuf(buf)
			return nil
		}
		c.hwg.Add(1)
		go func() {
			defer func() {
				<-c.sem
				c.hwg.Done()
			}()
			c.send(c.handle(h, id, buf))
		}()
	}
}

// frameBuffered reports whether br holds a whole request frame, so that reading it cannot
// wait on the connection.
func frameBuffered(br *bufio.Reader) bool {
	if br.Buffered() < 4 {
		return false
	}
	b, _ := br.Peek(4)
	return br.Buffered() >= 4+int(binary.BigEndian.Uint32(b))
}

// send queues responses; once the connection has ended they are dropped.
func (c *serverConn) send(fs ...outFrame) {
	_ = c.w.send(time.Time{}, fs...)
}

// writeOutFrame encodes f into bw and returns its payload buffer to the pool.
func writeOutFrame(bw *bufio.Writer, f outFrame) error {
	var hb [4 + respHeaderLen]byte
	f.h.encode(hb[:], respHeaderLen+len(f.payload))
	_, err := bw.Write(hb[:])
	if err == nil {
		_, err = bw.Write(f.payload)
	}
	putBuf(f.buf)
	return err
}

func errorFrame(id uint64, err error) outFrame {
	return outFrame{h: respHeader{id: id, status: statusOf(err)}, payload: []byte(err.Error())}
}

// replica returns the replica for this connection, acquiring it on first use.
func (c *serverConn) replica(id string) (*replica, error) {
	if id == "" {
		return nil, fmt.Errorf("empty replica id: %w", ErrInvalid)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.replicas[id]; r != nil {
		return r, nil
	}
	if c.replicas == nil {
		return nil, ErrClosed
	}
	if err := c.authorize(id); err != nil {
		return nil, err
	}
	r, err := c.s.acquire(id)
	if err != nil {
		return nil, err
	}
	c.replicas[id] = r
	return r, nil
}

// authorize asks the server's Authorize whether this connection's peer may use replica id
// (or the replica of snapshot id).
func (c *serverConn) authorize(id string) error {
	if c.s.o.Authorize == nil {
		return nil
	}
	if err := c.s.o.Authorize(c.peer, id); err != nil {
		return fmt.Errorf("%s may not use replica %s on node %s: %v: %w", c.peer, id, c.s.o.Node, err, ErrForbidden)
	}
	return nil
}

// handleInline applies write request h in the reader loop and returns its response, or
// reports !ok when the write would wait (a snapshot or the rebuild copier holds the replica's
// writes back): buf is then untouched, for handle to run in a goroutine.
func (c *serverConn) handleInline(h reqHeader, id string, buf *[]byte) (f outFrame, ok bool) {
	var payload []byte
	if buf != nil {
		payload = *buf
	}
	r, err := c.replica(id)
	if err != nil {
		putBuf(buf)
		return errorFrame(h.id, err), true
	}
	if err = c.writeChecks(r); err == nil {
		if err = r.tryWriteAt(payload, h.offset, h.arg); errors.Is(err, errWouldWait) {
			return outFrame{}, false
		}
		c.s.noteSpace(r.id, err)
	}
	putBuf(buf)
	if err != nil {
		return errorFrame(h.id, fmt.Errorf("replica %s on node %s: %w", id, c.s.o.Node, err)), true
	}
	return outFrame{h: respHeader{id: h.id}}, true
}

// writeChecks are what a write needs of r and of this connection besides its data.
func (c *serverConn) writeChecks(r *replica) error {
	if r.snap {
		return fmt.Errorf("snapshot %s is read-only: %w", r.id, ErrInvalid)
	}
	if r.owner.Load() != c {
		return ErrNoSession
	}
	return nil
}

func (c *serverConn) handle(h reqHeader, id string, buf *[]byte) outFrame {
	var payload []byte
	if buf != nil {
		payload = *buf
		defer putBuf(buf)
	}
	if h.op == opPing {
		return outFrame{h: respHeader{id: h.id}}
	}
	if h.op == opDeleteSnapshot {
		if err := c.authorize(id); err != nil {
			return errorFrame(h.id, err)
		}
		// Needs no session, nor the replica's data file: its snapshots go with it.
		if err := c.s.deleteSnapshot(id, string(payload)); err != nil {
			return errorFrame(h.id, fmt.Errorf("replica %s on node %s: %w", id, c.s.o.Node, err))
		}
		return outFrame{h: respHeader{id: h.id}}
	}
	r, err := c.replica(id)
	if err != nil {
		return errorFrame(h.id, err)
	}
	f, err := c.do(r, h, payload)
	switch h.op {
	case opWrite, opFlush, opCloseSession:
		c.s.noteSpace(r.id, err)
	}
	if err != nil {
		return errorFrame(h.id, fmt.Errorf("replica %s on node %s: %w", id, c.s.o.Node, err))
	}
	f.h.id = h.id
	return f
}

func (c *serverConn) do(r *replica, h reqHeader, payload []byte) (outFrame, error) {
	if r.snap && h.op != opRead && h.op != opInfo && h.op != opExtents {
		return outFrame{}, fmt.Errorf("snapshot %s is read-only: %w", r.id, ErrInvalid)
	}
	switch h.op {
	case opWrite:
		if err := c.writeChecks(r); err != nil {
			return outFrame{}, err
		}
		return outFrame{}, r.writeAt(payload, h.offset, h.arg)

	case opRead:
		if h.arg > MaxPayload {
			return outFrame{}, fmt.Errorf("read of %d bytes exceeds %d: %w", h.arg, MaxPayload, ErrTooLarge)
		}
		buf := getBuf(int(h.arg))
		if err := r.readAt(*buf, h.offset); err != nil {
			putBuf(buf)
			return outFrame{}, err
		}
		return outFrame{payload: *buf, buf: buf}, nil

	case opInfo:
		return c.infoFrame(r)

	case opOpen:
		if err := c.open(r); err != nil {
			return outFrame{}, err
		}
		return c.infoFrame(r)

	case opFlush:
		if r.owner.Load() != c {
			return outFrame{}, ErrNoSession
		}
		return outFrame{}, r.flush(nil)

	case opCloseSession:
		if r.owner.Load() != c {
			return outFrame{}, ErrNoSession
		}
		if err := r.flush(func(m *meta) { m.Dirty = false }); err != nil {
			return outFrame{}, err
		}
		r.owner.CompareAndSwap(c, nil)
		return outFrame{}, nil

	case opExtents:
		if h.offset < 0 {
			return outFrame{}, fmt.Errorf("extents from offset %d: %w", h.offset, ErrInvalid)
		}
		size := r.size.Load()
		if h.offset >= size {
			return outFrame{}, nil
		}
		end := h.offset + int64(min(h.arg, uint64(size-h.offset)))
		exts, more, err := r.extents(h.offset, end, MaxPayload/16)
		if err != nil {
			return outFrame{}, err
		}
		buf := getBuf(16 * len(exts))
		for i, e := range exts {
			binary.BigEndian.PutUint64((*buf)[16*i:], uint64(e.Offset))
			binary.BigEndian.PutUint64((*buf)[16*i+8:], uint64(e.Length))
		}
		f := outFrame{payload: *buf, buf: buf}
		if more {
			f.h.arg = 1
		}
		return f, nil

	case opSnapshot:
		name := string(payload)
		if err := ValidateSnapshotName(name); err != nil {
			return outFrame{}, err
		}
		switch owner := r.owner.Load(); {
		case owner == nil:
			return outFrame{}, ErrNoSession
		case owner != c:
			// Only the writer knows when its writes are settled.
			return outFrame{}, ErrBusy
		}
		in, err := c.s.snapshot(r, name)
		if err != nil {
			return outFrame{}, err
		}
		data, err := json.Marshal(in)
		if err != nil {
			return outFrame{}, err
		}
		return outFrame{payload: data}, nil

	case opFile:
		// sendFile answers it where it may be asked.
		if c.localToken == "" {
			return outFrame{}, fmt.Errorf("a replica's file is handed out only on the local socket: %w", ErrForbidden)
		}
		return outFrame{}, fmt.Errorf("a replica's file is asked for as a connection's only request: %w", ErrInvalid)

	case opRebuild:
		addr, srcID, err := decodeRebuild(payload)
		if err != nil {
			return outFrame{}, err
		}
		return outFrame{}, c.s.startRebuild(r, addr, srcID, nil)
	}
	return outFrame{}, fmt.Errorf("unknown operation %d: %w", h.op, ErrInvalid)
}

// open starts c's writer session on r. It is exclusive: another connection's session must
// end first (CloseSession or disconnect). Dirty is durable before the session starts, so a
// crash during the session is always detected.
func (c *serverConn) open(r *replica) error {
	if r.owner.Load() == c {
		return nil
	}
	if !r.owner.CompareAndSwap(nil, c) {
		return ErrBusy
	}
	if _, err := r.persist(func(m *meta) {
		m.Dirty = true
		m.Epoch++
	}); err != nil {
		r.owner.CompareAndSwap(c, nil)
		return err
	}
	return nil
}

func (c *serverConn) infoFrame(r *replica) (outFrame, error) {
	data, err := json.Marshal(c.s.info(r))
	if err != nil {
		return outFrame{}, err
	}
	return outFrame{payload: data}, nil
}

// noteSpace records the outcome of a write to replica id: a failure for lack of space is
// kept until a write succeeds.
func (s *Server) noteSpace(id string, err error) {
	switch {
	case errors.Is(err, ErrNoSpace):
		s.noSpace.Store(id, fmt.Sprintf("%s: %v", time.Now().UTC().Format(time.RFC3339), err))
	case err == nil:
		if _, ok := s.noSpace.Load(id); ok {
			s.noSpace.Delete(id)
		}
	}
}

func (s *Server) info(r *replica) Info {
	m := r.durable()
	in := Info{
		ID:         r.id,
		Size:       r.size.Load(),
		Revision:   r.rev.Load(),
		Dirty:      m.Dirty,
		Rebuilding: m.Rebuilding,
		Allocated:  r.allocated(),
		Epoch:      m.Epoch,
		Session:    r.owner.Load() != nil,
	}
	if m.Rebuilding {
		in.RebuildSource = m.RebuildSource
	}
	if v, ok := s.noSpace.Load(r.id); ok {
		in.NoSpace = v.(string)
	}
	s.mu.Lock()
	st := s.rebuilds[r.id]
	s.mu.Unlock()
	if st != nil {
		in.RebuildDone, in.RebuildTotal = st.done.Load(), st.total.Load()
		if m.Rebuilding {
			if in.RebuildSource == "" {
				in.RebuildSource = st.source // metadata written before it recorded the source
			}
			if e := st.err.Load(); e != nil {
				in.RebuildError = *e
			}
		}
	}
	return in
}

func encodeRebuild(addr, id string) ([]byte, error) {
	if len(addr) > maxIDLen || len(id) > maxIDLen {
		return nil, fmt.Errorf("rebuild source too long: %w", ErrInvalid)
	}
	b := make([]byte, 0, 4+len(addr)+len(id))
	b = binary.BigEndian.AppendUint16(b, uint16(len(addr)))
	b = append(b, addr...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(id)))
	return append(b, id...), nil
}

func decodeRebuild(b []byte) (addr, id string, err error) {
	field := func() (string, bool) {
		if len(b) < 2 {
			return "", false
		}
		n := int(binary.BigEndian.Uint16(b))
		if len(b) < 2+n {
			return "", false
		}
		s := string(b[2 : 2+n])
		b = b[2+n:]
		return s, true
	}
	addr, ok1 := field()
	id, ok2 := field()
	if !ok1 || !ok2 || len(b) != 0 || addr == "" || id == "" {
		return "", "", fmt.Errorf("malformed rebuild request: %w", ErrInvalid)
	}
	return addr, id, nil
}

// rebuildState is the progress of a replica's current or last rebuild. It lives in the
// server, not the replica, so it outlasts the replica file being closed and reopened.
type rebuildState struct {
	running bool   // guarded by Server.mu
	source  string // addr + "/" + id
	// epoch is the replica's writer-session epoch when the rebuild was asked for.
	epoch uint64
	// writer holds the replica's writer session when the rebuild started, nil if none: the
	// copy is complete only if that writer fed the replica every write until the end.
	writer *serverConn
	cancel context.CancelCauseFunc
	// started is closed once Rebuilding is durable and the file punched, or the start
	// failed with startErr; stopped once the copier let go of the replica.
	started, stopped chan struct{}
	startErr         error
	done, total      atomic.Int64
	err              atomic.Pointer[string]
}
