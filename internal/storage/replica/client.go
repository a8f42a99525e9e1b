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
	"syscall"

	"github.com/crdipc/crdipc/internal/localsock"
)

// Conn is one pipelined, mutually authenticated connection to a replica server (over TLS,
// or over the node's local socket, DialLocal). Any number
// of goroutines may use it at once; their requests share the connection and complete in
// whatever order the server finishes them.
type Conn struct {
	addr string
	nc   net.Conn

	w      *frameWriter[*call]
	nextID atomic.Uint64

	mu      sync.Mutex
	pending map[uint64]*call
	err     error // why the connection ended

	once sync.Once
	wg   sync.WaitGroup
}

type call struct {
	h       reqHeader
	replica string
	payload []byte
	buf     *[]byte // pooled payload, returned by the writer once sent
	// released, when not nil, says that payload is the caller's own buffer (not copied):
	// it is closed once the frame writer is done with payload, written or dropped, and
	// the caller may not reuse the buffer before (Client.wait sees to it).
	released chan struct{}
	res      chan result
}

// release hands the call's payload back once the frame writer is done with it: to the pool,
// or, for a caller's buffer, to the caller.
func (cl *call) release() {
	if cl.released != nil {
		close(cl.released)
		return
	}
	putBuf(cl.buf)
}

type result struct {
	h   respHeader
	buf *[]byte // pooled response payload; the receiver returns it
	err error
}

func (r *result) data() []byte {
	if r.buf == nil {
		return nil
	}
	return *r.buf
}

// Dial connects to the replica server at addr ("ip:port") with tlsConf (see
// ClientTLSConfig). It returns only once the server has accepted the client certificate,
// so a refused client fails here rather than on its first request.
func Dial(ctx context.Context, addr string, tlsConf *tls.Config) (*Conn, error) {
	if tlsConf == nil {
		return nil, fmt.Errorf("dialing replica server %s: no tls config", addr)
	}
	conf := tlsConf.Clone()
	conf.NextProtos = []string{ALPN}
	conf.MinVersion = max(conf.MinVersion, tls.VersionTLS13)
	// A replica server that vanished is found as a server finds a vanished client.
	d := tls.Dialer{Config: conf, NetDialer: &net.Dialer{KeepAliveConfig: keepAlive, Control: func(_, _ string, c syscall.RawConn) error {
		return setUserTimeout(c)
	}}}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dialing replica server %s: %w", addr, err)
	}
	c := newConn(addr, nc)
	// In TLS 1.3 the server checks the client certificate after the client considers the
	// handshake done; a round trip surfaces its verdict.
	if _, err := c.roundTrip(ctx, &call{h: reqHeader{op: opPing}}); err != nil {
		c.Close()
		return nil, fmt.Errorf("replica server %s refused the connection: %w", addr, err)
	}
	return c, nil
}

// DialLocal connects to the replica server of this node on its local socket at path
// (ServerOptions.LocalSocket), without TLS, presenting the token beside the socket. node is
// the node whose server the caller means: a socket that answers for another is refused.
func DialLocal(ctx context.Context, path, node string) (*Conn, error) {
	uc, hello, err := localsock.Dial(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("dialing the local replica server: %w", err)
	}
	if hello != node {
		uc.Close()
		return nil, fmt.Errorf("the replica server on the local socket %s serves node %q, not %q", path, hello, node)
	}
	// Admitted: the server answered the handshake, so no ping is needed to learn its verdict.
	return newConn("unix:"+path, uc), nil
}

func newConn(addr string, nc net.Conn) *Conn {
	c := &Conn{
		addr:    addr,
		nc:      nc,
		pending: map[uint64]*call{},
	}
	c.w = newFrameWriter(nc, writeCall, (*call).release, c.fail)
	c.wg.Add(1)
	go c.readLoop()
	return c
}

// Close closes the connection; calls in flight fail with ErrClosed. A writer session held
// through it ends (without clearing Dirty).
func (c *Conn) Close() error {
	c.fail(ErrClosed)
	c.wg.Wait()
	return nil
}

// fail ends the connection for reason and fails every pending call.
func (c *Conn) fail(reason error) {
	c.once.Do(func() {
		c.mu.Lock()
		c.err = fmt.Errorf("connection to replica server %s: %w", c.addr, reason)
		if reason != ErrClosed {
			c.err = fmt.Errorf("connection to replica server %s: %w: %w", c.addr, ErrClosed, reason)
		}
		pending := c.pending
		c.pending = nil
		c.mu.Unlock()
		c.w.close(c.err)
		c.nc.Close()
		for _, cl := range pending {
			cl.res <- result{err: c.err}
		}
	})
}

func (c *Conn) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// roundTrip sends cl and waits for its response. A context that ends first abandons the
// call: its outcome is then unknown (a write may still be applied).
func (c *Conn) roundTrip(ctx context.Context, cl *call) (result, error) {
	if err := c.start(ctx, cl); err != nil {
		return result{}, err
	}
	return c.wait(ctx, cl)
}

func (c *Conn) start(ctx context.Context, cl *call) error {
	cl.h.id = c.nextID.Add(1)
	cl.h.idLen = uint16(len(cl.replica))
	cl.res = make(chan result, 1)
	if err := ctx.Err(); err != nil {
		cl.release()
		return err
	}
	c.mu.Lock()
	if c.pending == nil {
		c.mu.Unlock()
		cl.release()
		return c.closedErr()
	}
	c.pending[cl.h.id] = cl
	c.mu.Unlock()
	deadline, _ := ctx.Deadline()
	if err := c.w.send(deadline, cl); err != nil {
		c.abandon(cl)
		if cerr := c.closedErr(); cerr != nil {
			return cerr
		}
		return fmt.Errorf("connection to replica server %s: %w: %w", c.addr, ErrClosed, err)
	}
	return nil
}

func (c *Conn) wait(ctx context.Context, cl *call) (result, error) {
	select {
	case r := <-cl.res:
		if r.err != nil {
			return r, r.err
		}
		if r.h.status != statusOK {
			err := &RemoteError{Code: r.h.status, Msg: string(r.data())}
			putBuf(r.buf)
			return result{}, err
		}
		return r, nil
	case <-ctx.Done():
		c.abandon(cl)
		return result{}, ctx.Err()
	}
}

func (c *Conn) abandon(cl *call) {
	c.mu.Lock()
	if c.pending != nil {
		delete(c.pending, cl.h.id)
	}
	c.mu.Unlock()
}

// writeCall encodes cl's request frame into bw and releases its payload: once bw.Write
// returns, the bytes are in bw's buffer or on the connection.
func writeCall(bw *bufio.Writer, cl *call) error {
	var hb [4 + reqHeaderLen]byte
	cl.h.encode(hb[:], reqHeaderLen+len(cl.replica)+len(cl.payload))
	_, err := bw.Write(hb[:])
	if err == nil {
		_, err = bw.WriteString(cl.replica)
	}
	if err == nil {
		_, err = bw.Write(cl.payload)
	}
	cl.release()
	return err
}

func (c *Conn) readLoop() {
	defer c.wg.Done()
	br := bufio.NewReaderSize(c.nc, 64<<10)
	var hb [4 + respHeaderLen]byte
	for {
		if _, err := io.ReadFull(br, hb[:]); err != nil {
			c.fail(err)
			return
		}
		total := int64(binary.BigEndian.Uint32(hb[:4]))
		if total < respHeaderLen || total > respHeaderLen+MaxPayload {
			c.fail(fmt.Errorf("bad response frame of %d bytes", total))
			return
		}
		var h respHeader
		h.decode(hb[4:])
		n := int(total - respHeaderLen)
		c.mu.Lock()
		cl := c.pending[h.id]
		if cl != nil {
			delete(c.pending, h.id)
		}
		c.mu.Unlock()
		if cl == nil {
			// Abandoned by its caller.
			if _, err := io.CopyN(io.Discard, br, int64(n)); err != nil {
				c.fail(err)
				return
			}
			continue
		}
		var buf *[]byte
		if n > 0 {
			buf = getBuf(n)
			if _, err := io.ReadFull(br, *buf); err != nil {
				putBuf(buf)
				cl.res <- result{err: fmt.Errorf("connection to replica server %s: %w: %w", c.addr, ErrClosed, err)}
				c.fail(err)
				return
			}
		}
		cl.res <- result{h: h, buf: buf}
	}
}

// Client is a handle on one replica through a Conn. It is cheap; make one per use.
type Client struct {
	c  *Conn
	id string
}

// Replica returns a handle on replica id ("namespace/name") of the server.
func (c *Conn) Replica(id string) *Client { return &Client{c: c, id: id} }

// ID is the replica id.
func (r *Client) ID() string { return r.id }

func (r *Client) simple(ctx context.Context, op uint8, off int64, arg uint64, payload []byte) (result, error) {
	if len(r.id) == 0 || len(r.id) > maxIDLen {
		return result{}, fmt.Errorf("replica id %q: %w", r.id, ErrInvalid)
	}
	return r.c.roundTrip(ctx, &call{h: reqHeader{op: op, offset: off, arg: arg}, replica: r.id, payload: payload})
}

func (r *Client) info(ctx context.Context, op uint8) (Info, error) {
	res, err := r.simple(ctx, op, 0, 0, nil)
	if err != nil {
		return Info{}, err
	}
	defer putBuf(res.buf)
	var in Info
	if err := json.Unmarshal(res.data(), &in); err != nil {
		return Info{}, fmt.Errorf("decoding replica info: %w", err)
	}
	return in, nil
}

// Info reports the replica's state.
func (r *Client) Info(ctx context.Context) (Info, error) { return r.info(ctx, opInfo) }

// Open starts this connection's writer session on the replica and returns its state. The
// session is exclusive (ErrBusy while another connection holds it) and ends with
// CloseSession or when the connection closes. Dirty is durable when Open returns.
func (r *Client) Open(ctx context.Context) (Info, error) { return r.info(ctx, opOpen) }

// WriteAt writes p at off with revision rev (the replica's Revision becomes at least rev).
// Needs the writer session; off and len(p) must be multiples of SectorSize. Buffers larger
// than MaxPayload go as several pipelined requests.
func (r *Client) WriteAt(ctx context.Context, p []byte, off int64, rev uint64) error {
	return r.split(ctx, len(p), r.writePiece(p, off, rev), nil)
}

// borrowMin is the least write payload sent from the caller's buffer rather than a copy of
// it: below it, copying costs less than the channel that says when the buffer is free.
const borrowMin = 64 << 10

// writePiece makes the request of bytes [i, i+n) of a write of p at off. A piece of at
// least borrowMin bytes is sent from p itself, saving a copy of every byte per replica;
// wait returns only once the frame writer is done with it, so p is the caller's again when
// the write returns, whatever its outcome.
func (r *Client) writePiece(p []byte, off int64, rev uint64) func(i, n int) *call {
	return func(i, n int) *call {
		cl := &call{h: reqHeader{op: opWrite, offset: off + int64(i), arg: rev}, replica: r.id}
		if n >= borrowMin {
			cl.payload, cl.released = p[i:i+n], make(chan struct{})
			return cl
		}
		buf := getBuf(n)
		copy(*buf, p[i:i+n])
		cl.payload, cl.buf = *buf, buf
		return cl
	}
}

// ReadAt fills p from off; holes read as zeros. It reads all of p or fails.
func (r *Client) ReadAt(ctx context.Context, p []byte, off int64) error {
	return r.split(ctx, len(p), func(i, n int) *call {
		return &call{h: reqHeader{op: opRead, offset: off + int64(i), arg: uint64(n)}, replica: r.id}
	}, func(i, n int, res result) error {
		if len(res.data()) != n {
			return fmt.Errorf("short read from replica %s: %d of %d bytes", r.id, len(res.data()), n)
		}
		copy(p[i:i+n], res.data())
		return nil
	})
}

// PendingWrite is a write sent by StartWriteAt and not yet waited for.
type PendingWrite struct {
	r  *Client
	ps []piece
	// err is the first failure to send a piece; the pieces sent before it are still
	// waited for, since they may be applied.
	err error
}

// StartWriteAt sends a write as WriteAt does and returns without waiting for its outcome,
// which Wait reports. One goroutine can so have a write in flight to several replicas at
// once without a goroutine for each. p may be read until Wait returns: it must not change
// before, and Wait must be called.
func (r *Client) StartWriteAt(ctx context.Context, p []byte, off int64, rev uint64) *PendingWrite {
	ps, err := r.start(ctx, len(p), r.writePiece(p, off, rev))
	return &PendingWrite{r: r, ps: ps, err: err}
}

// Wait waits for the write and reports its outcome; ctx bounds the wait.
func (w *PendingWrite) Wait(ctx context.Context) error {
	return w.r.wait(ctx, w.ps, w.err, nil)
}

// split runs a request of n bytes as pieces of at most MaxPayload, all in flight at once.
func (r *Client) split(ctx context.Context, n int, mk func(i, n int) *call, got func(i, n int, res result) error) error {
	ps, err := r.start(ctx, n, mk)
	return r.wait(ctx, ps, err, got)
}

// piece is one request of a split one: bytes [i, i+n) of it.
type piece struct {
	i, n int
	cl   *call
	// answered: the server's response to it came, so it was sent whole.
	answered bool
}

// start sends the pieces of a request of n bytes, made by mk, and returns those sent and
// the error that stopped it sending more.
func (r *Client) start(ctx context.Context, n int, mk func(i, n int) *call) ([]piece, error) {
	if len(r.id) == 0 || len(r.id) > maxIDLen {
		return nil, fmt.Errorf("replica id %q: %w", r.id, ErrInvalid)
	}
	ps := make([]piece, 0, (n+MaxPayload-1)/MaxPayload+1)
	for i := 0; i < n || (n == 0 && i == 0); i += MaxPayload {
		m := min(MaxPayload, n-i)
		cl := mk(i, m)
		if err := r.c.start(ctx, cl); err != nil {
			return ps, err
		}
		ps = append(ps, piece{i: i, n: m, cl: cl})
	}
	return ps, nil
}

// wait waits for every piece sent, handing each response to got, and returns the first
// error: firstErr (the sending's), else a piece's. It returns only once the frame writer is
// done with every piece sent from the caller's buffer.
func (r *Client) wait(ctx context.Context, ps []piece, firstErr error, got func(i, n int, res result) error) error {
	for k, p := range ps {
		res, err := r.c.wait(ctx, p.cl)
		var remote *RemoteError
		ps[k].answered = err == nil || errors.As(err, &remote)
		if err == nil && got != nil {
			err = got(p.i, p.n, res)
		}
		putBuf(res.buf)
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for _, p := range ps {
		if p.cl.released == nil {
			continue
		}
		select {
		case <-p.cl.released:
		default:
			// An answered piece was sent: its writer is about to release it. One given up
			// on (the context ended) may still be queued or being sent: the connection
			// ends, which drops or breaks off the frame, rather than go on reading a
			// buffer that is the caller's again. A write given up on faults its replica
			// anyway.
			if !p.answered {
				r.c.fail(fmt.Errorf("a write of %d bytes was given up on while being sent: %w", p.n, firstErr))
			}
			<-p.cl.released
		}
	}
	return firstErr
}

// Flush makes every write acknowledged so far durable, then persists the revision.
func (r *Client) Flush(ctx context.Context) error {
	_, err := r.simple(ctx, opFlush, 0, 0, nil)
	return err
}

// CloseSession flushes, clears Dirty durably and ends the writer session.
func (r *Client) CloseSession(ctx context.Context) error {
	_, err := r.simple(ctx, opCloseSession, 0, 0, nil)
	return err
}

// Extents lists the allocated ranges of the replica within [off, off+length).
func (r *Client) Extents(ctx context.Context, off, length int64) ([]Extent, error) {
	var exts []Extent
	end := off + length
	for off < end {
		res, err := r.simple(ctx, opExtents, off, uint64(end-off), nil)
		if err != nil {
			return nil, err
		}
		d := res.data()
		for i := 0; i+16 <= len(d); i += 16 {
			exts = append(exts, Extent{
				Offset: int64(binary.BigEndian.Uint64(d[i:])),
				Length: int64(binary.BigEndian.Uint64(d[i+8:])),
			})
		}
		putBuf(res.buf)
		if res.h.arg == 0 || len(exts) == 0 {
			break
		}
		last := exts[len(exts)-1]
		off = last.Offset + last.Length
	}
	return exts, nil
}

// Rebuild makes the replica a copy of replica sourceID on the server at sourceAddr,
// copying in the background (progress, source and errors in Info). It returns once the
// rebuild is durably recorded and started. A rebuild already running from the same source,
// asked for within the same writer session, is kept; any other is cancelled and the copy
// starts over from the new source. Writes sent after Rebuild returns are kept; the copy
// never overwrites them.
func (r *Client) Rebuild(ctx context.Context, sourceAddr, sourceID string) error {
	payload, err := encodeRebuild(sourceAddr, sourceID)
	if err != nil {
		return err
	}
	_, err = r.simple(ctx, opRebuild, 0, 0, payload)
	return err
}

// Snapshot takes snapshot name of the replica: a crash-consistent copy of its data as of
// the call, made under a lock that holds back the replica's writes (reads go on). It needs
// this connection's writer session (ErrNoSession without one, ErrBusy when another
// connection holds it), since only the writer knows when its writes are settled. A
// complete snapshot of that name is reported as it is (Created false); a partial one is
// taken again. ErrNoSpace when the file system cannot hold the copy; ErrInvalid for a bad
// name (ValidateSnapshotName) or a replica that is rebuilding. The snapshot is then served
// read-only as replica SnapshotID(id, name).
func (r *Client) Snapshot(ctx context.Context, name string) (SnapshotInfo, error) {
	if err := ValidateSnapshotName(name); err != nil {
		return SnapshotInfo{}, err
	}
	res, err := r.simple(ctx, opSnapshot, 0, 0, []byte(name))
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer putBuf(res.buf)
	var in SnapshotInfo
	if err := json.Unmarshal(res.data(), &in); err != nil {
		return SnapshotInfo{}, fmt.Errorf("decoding snapshot info: %w", err)
	}
	return in, nil
}

// DeleteSnapshot deletes snapshot name of the replica; a missing one is success. It needs
// no writer session. Readers that have the snapshot open keep reading it until they let go.
func (r *Client) DeleteSnapshot(ctx context.Context, name string) error {
	if err := ValidateSnapshotName(name); err != nil {
		return err
	}
	_, err := r.simple(ctx, opDeleteSnapshot, 0, 0, []byte(name))
	return err
}
