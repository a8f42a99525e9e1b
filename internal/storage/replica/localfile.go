package replica

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/localsock"
)

// A target reads the replica on its own node most: every read of a volume goes to it. Over
// the local socket each read is still a request, a reply and two copies through the socket
// (replica.BenchmarkRead1MiB). With a read-only descriptor of the replica's data file the
// target reads it with one pread instead, from the same page cache the server writes into,
// so a read that follows an acknowledged write sees it. Writes still go through the server,
// which keeps their fencing (writer session, revision, the rebuild's fresh sectors, a
// snapshot's hold).

// maxFileReply bounds opFile's answer: its header and, on refusal, the reason.
const maxFileReply = 4 + respHeaderLen + 4096

// sendFile answers opFile h for replica id, the first request of a connection of the local
// socket, with a read-only descriptor of the replica's data file passed as SCM_RIGHTS with
// the answer, or with an error frame. The connection then ends (the returned error is
// io.EOF): a descriptor rides on bytes no other frame may share, and nothing else was sent
// on the connection before it. (Asked for otherwise, opFile is refused by do.)
func (c *serverConn) sendFile(h reqHeader, id string) error {
	uc := c.nc.(*net.UnixConn)
	r, err := c.replica(id)
	var f *os.File
	if err == nil {
		f, err = r.openReadOnly()
	}
	var reply outFrame
	var oob []byte
	if err != nil {
		reply = errorFrame(h.id, fmt.Errorf("replica %s on node %s: %w", id, c.s.o.Node, err))
	} else {
		defer f.Close()
		reply = outFrame{h: respHeader{id: h.id}}
		oob = unix.UnixRights(int(f.Fd()))
	}
	b := make([]byte, 4+respHeaderLen+len(reply.payload))
	reply.h.encode(b, respHeaderLen+len(reply.payload))
	copy(b[4+respHeaderLen:], reply.payload)
	_ = uc.SetWriteDeadline(time.Now().Add(c.s.o.HandshakeTimeout))
	if _, _, werr := uc.WriteMsgUnix(b, oob, nil); werr != nil {
		return werr
	}
	return io.EOF
}

// openReadOnly opens r's data file again, read-only, through its open descriptor: the
// same file, whatever has happened to its name since.
func (r *replica) openReadOnly() (*os.File, error) {
	var f *os.File
	err := r.withFd(func(fd int) error {
		nfd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("reopening replica %s read-only: %w", r.id, err)
		}
		f = os.NewFile(uintptr(nfd), r.id)
		return nil
	})
	return f, err
}

// OpenLocalFile asks the replica server of node on its local socket at path for a read-only
// descriptor of replica id's data file. Reading it is reading the replica as ReadAt does,
// without a round trip; it stays valid while the replica's file exists, so the caller uses it
// only while the replica is healthy in its writer session. A server that predates this
// request answers with ErrInvalid.
func OpenLocalFile(ctx context.Context, path, node, id string) (*os.File, error) {
	if len(id) == 0 || len(id) > maxIDLen {
		return nil, fmt.Errorf("replica id %q: %w", id, ErrInvalid)
	}
	uc, hello, err := localsock.Dial(ctx, path)
	if err != nil {
		return nil, fmt.Errorf("dialing the local replica server: %w", err)
	}
	defer uc.Close()
	if hello != node {
		return nil, fmt.Errorf("the replica server on the local socket %s serves node %q, not %q", path, hello, node)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = uc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { uc.SetDeadline(time.Now()) })
	defer stop()

	req := make([]byte, 4+reqHeaderLen+len(id))
	(&reqHeader{id: 1, op: opFile, idLen: uint16(len(id))}).encode(req, reqHeaderLen+len(id))
	copy(req[4+reqHeaderLen:], id)
	if _, err := uc.Write(req); err != nil {
		return nil, fmt.Errorf("asking for replica %s's file: %w", id, err)
	}

	// The descriptor comes with the answer's first bytes; read them with their control message.
	b := make([]byte, maxFileReply)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := uc.ReadMsgUnix(b, oob)
	fds, perr := localsock.Rights(oob[:oobn])
	var f *os.File
	for i, fd := range fds {
		if i == 0 {
			f = os.NewFile(uintptr(fd), id)
		} else {
			unix.Close(fd) // never sent: only one is asked for
		}
	}
	fail := func(err error) (*os.File, error) {
		if f != nil {
			f.Close()
		}
		return nil, err
	}
	if err == nil {
		err = perr
	}
	if err == nil && n < 4+respHeaderLen {
		// The rest of a short answer; a header is never split by a server, but a stream may.
		var m int
		m, err = io.ReadAtLeast(uc, b[n:], 4+respHeaderLen-n)
		n += m
	}
	if err != nil {
		return fail(fmt.Errorf("reading the answer for replica %s's file: %w", id, err))
	}
	total := int(binary.BigEndian.Uint32(b[:4]))
	if total < respHeaderLen || 4+total > len(b) {
		return fail(fmt.Errorf("bad answer frame of %d bytes for replica %s's file", total, id))
	}
	if n < 4+total {
		if _, err := io.ReadFull(uc, b[n:4+total]); err != nil {
			return fail(fmt.Errorf("reading the answer for replica %s's file: %w", id, err))
		}
	}
	var h respHeader
	h.decode(b[4:])
	if h.status != statusOK {
		return fail(&RemoteError{Code: h.status, Msg: string(b[4+respHeaderLen : 4+total])})
	}
	if f == nil {
		return nil, fmt.Errorf("the answer for replica %s's file carried no descriptor", id)
	}
	return f, nil
}
