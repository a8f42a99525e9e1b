package blockdev

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// server speaks the FUSE protocol for an export's one directory and one file. It is ours,
// not go-fuse's Server, because a connection has to outlive the process serving it: a
// successor adopts an initialised connection (no FUSE_INIT comes again), stops reading on
// request, and asks the kernel to resend what a dead predecessor had read (NOTIFY_RESEND).
// go-fuse can do none of those. Its protocol types are what the kernel's ABI is written in
// here.
//
// Every server of a connection agrees on what the kernel was told, because nothing of it
// lives in a process: the directory is node 1 (FUSE_ROOT_ID), the file node 2, and a file
// handle says only whether it may write (fhReadOnly, fhWritable).
type server struct {
	fd       int // /dev/fuse, non-blocking
	stopFD   int // eventfd: readable once the readers are to stop
	vol      *volume
	log      *slog.Logger
	debug    bool
	maxWrite int

	readers  sync.WaitGroup
	done     chan struct{} // closed when every reader has returned and fd is closed
	initOnce sync.Once
	inited   chan struct{} // closed when FUSE_INIT has been answered
	stopOnce sync.Once
	stopping atomic.Bool // set by stop: readers that are not waiting see it before reading
}

const (
	rootNode = 1 // FUSE_ROOT_ID
	fileNode = 2

	fhReadOnly = 1
	fhWritable = 2

	// serveReaders requests are handled at once: each reader reads one, calls the Device
	// and answers before reading the next. Enough to keep a network-backed Device busy
	// with the loop driver's direct I/O (MaxBackground bounds the kernel's side).
	serveReaders = 16
	// protocolMinor is the newest FUSE 7.x this server speaks (Linux 6.9 and later are
	// 7.40+). Every reply it sends is the same from 7.23 on.
	protocolMinor = 40

	// A read buffer must hold the largest WRITE (header, write_in, max_write bytes); the
	// data of a READ reply is put past the first page of the request's buffer.
	pageSize = 4096
	bufSize  = defaultMaxWrite + pageSize

	// attrForever: the file's attributes change only when Resize grows it, which tells the
	// kernel, so the kernel may cache them (and the entry) for as long as it likes; that
	// saves a GETATTR round trip per loop I/O.
	attrForever = 24 * time.Hour
)

// Opcodes of the FUSE protocol (linux/fuse.h); go-fuse keeps its own unexported.
const (
	opLookup      = 1
	opForget      = 2
	opGetattr     = 3
	opSetattr     = 4
	opOpen        = 14
	opRead        = 15
	opWrite       = 16
	opStatfs      = 17
	opRelease     = 18
	opFsync       = 20
	opFlush       = 25
	opInit        = 26
	opOpendir     = 27
	opReaddir     = 28
	opReleasedir  = 29
	opFsyncdir    = 30
	opInterrupt   = 36
	opDestroy     = 38
	opNotifyReply = 41
	opBatchForget = 42
)

// initFlags are what this server asks for at FUSE_INIT, of what the kernel offers.
// ASYNC_DIO lets the kernel split a large direct-I/O request from the loop driver into
// MaxWrite-sized requests that are in flight at once; MAX_PAGES lets a request be 1 MiB.
const initFlags = fuse.CAP_ASYNC_READ | fuse.CAP_BIG_WRITES | fuse.CAP_ASYNC_DIO |
	fuse.CAP_MAX_PAGES | fuse.CAP_PARALLEL_DIROPS

var bufPool = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}

// Handles for the volume's Flush, which flushes the Device only for a writable one.
var (
	roHandle = &handle{writable: false}
	rwHandle = &handle{writable: true}
)

func newServer(fd int, vol *volume, o Options) (*server, error) {
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &server{
		fd: fd, stopFD: stop, vol: vol, log: o.Logger, debug: o.Debug, maxWrite: o.MaxWrite,
		done: make(chan struct{}), inited: make(chan struct{}),
	}, nil
}

// mountFUSE opens /dev/fuse and mounts a new connection of it at dir, as the fuse
// helpers do but without one: the descriptor is ours from the start.
func mountFUSE(dir string) (int, error) {
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, fmt.Errorf("open /dev/fuse: %w", err)
	}
	data := fmt.Sprintf("fd=%d,rootmode=40000,user_id=%d,group_id=%d", fd, os.Getuid(), os.Getgid())
	if err := unix.Mount(fuseSource, dir, fuseType, unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mount %s at %s: %w", fuseType, dir, err)
	}
	return fd, nil
}

// The mount table's source and type of an export's FUSE mount.
const (
	fuseSource = "crdipc-blockdev"
	fuseType   = "fuse.crdipc"
)

// start runs the readers; done closes when they have all returned.
func (s *server) start() {
	s.readers.Add(serveReaders)
	for range serveReaders {
		go s.reader()
	}
	go func() {
		s.readers.Wait()
		unix.Close(s.fd)
		unix.Close(s.stopFD)
		close(s.done)
	}()
}

// stop makes the readers return after answering the request each is handling; requests not
// read yet stay queued in the kernel for whoever serves the connection next.
func (s *server) stop() {
	s.stopOnce.Do(func() {
		s.stopping.Store(true)
		var one [8]byte
		*(*uint64)(unsafe.Pointer(&one[0])) = 1
		if _, err := unix.Write(s.stopFD, one[:]); err != nil {
			s.log.Error("stopping the FUSE readers", "err", err)
		}
	})
}

// dup returns a new descriptor of the connection, for a process that is to keep it open.
func (s *server) dup() (int, error) {
	select {
	case <-s.done:
		return -1, errors.New("the FUSE server has stopped")
	default:
	}
	fd, err := unix.FcntlInt(uintptr(s.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("dup the FUSE descriptor: %w", err)
	}
	return fd, nil
}

// reader reads and answers requests until stop. Each reader waits in an epoll instance of
// its own, the connection added EPOLLEXCLUSIVE: a request wakes one idle reader, not all of
// them (16 threads woken to read one 4 KiB write, 15 of them for nothing, cost more than
// the write). A reader that has answered reads again at once, waiting only when nothing
// is queued.
func (s *server) reader() {
	defer s.readers.Done()
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		s.log.Error("FUSE server: epoll; this reader stops", "err", err)
		return
	}
	defer unix.Close(ep)
	for _, w := range []struct {
		fd     int
		events uint32
	}{{s.fd, unix.EPOLLIN | unix.EPOLLEXCLUSIVE}, {s.stopFD, unix.EPOLLIN}} {
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, w.fd, &unix.EpollEvent{Events: w.events, Fd: int32(w.fd)}); err != nil {
			s.log.Error("FUSE server: epoll; this reader stops", "err", err)
			return
		}
	}
	events := make([]unix.EpollEvent, 2)
	for !s.stopping.Load() {
		// The open file description is shared with every process holding the connection;
		// one of them may have made it blocking, and a reader blocked in read could not
		// stop. Checking costs a syscall per request; setting it, one more when needed.
		if err := s.nonblocking(); err != nil {
			s.log.Error("FUSE server: set non-blocking", "err", err)
			return
		}
		bp := bufPool.Get().(*[]byte)
		n, err := unix.Read(s.fd, *bp)
		switch {
		case err == nil:
			s.handle((*bp)[:n], *bp)
			bufPool.Put(bp)
			continue
		case errors.Is(err, unix.EAGAIN):
			bufPool.Put(bp)
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.ENOENT):
			// The kernel withdrew an interrupted request.
			bufPool.Put(bp)
			continue
		case errors.Is(err, unix.ENODEV):
			bufPool.Put(bp)
			return // unmounted or aborted
		default:
			bufPool.Put(bp)
			s.log.Error("FUSE server: read failed; this reader stops", "err", err)
			return
		}
		// Nothing queued: wait for a request, or for stop.
		n, err = unix.EpollWait(ep, events, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			s.log.Error("FUSE server: epoll_wait failed; this reader stops", "err", err)
			return
		}
		for _, ev := range events[:n] {
			if ev.Fd == int32(s.stopFD) {
				return
			}
			if ev.Events&(unix.EPOLLERR|unix.EPOLLHUP) != 0 {
				return // unmounted or aborted
			}
		}
	}
}

// nonblocking makes the connection's file description non-blocking if it is not.
func (s *server) nonblocking() error {
	fl, err := unix.FcntlInt(uintptr(s.fd), unix.F_GETFL, 0)
	if err != nil {
		return err
	}
	if fl&unix.O_NONBLOCK != 0 {
		return nil
	}
	_, err = unix.FcntlInt(uintptr(s.fd), unix.F_SETFL, fl|unix.O_NONBLOCK)
	return err
}

var inHeaderSize = int(unsafe.Sizeof(fuse.InHeader{}))

// in views the start of a request as the kernel's struct T, or reports a short request.
func in[T any](req []byte) (*T, bool) {
	var zero T
	if len(req) < int(unsafe.Sizeof(zero)) {
		return nil, false
	}
	return (*T)(unsafe.Pointer(&req[0])), true
}

// bytesOf is the memory of *v, for a reply.
func bytesOf[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

// handle answers one request. buf is the whole buffer req was read into; a READ reply's
// data goes into it past the request.
func (s *server) handle(req, buf []byte) {
	h, ok := in[fuse.InHeader](req)
	if !ok {
		s.log.Error("FUSE server: request shorter than its header", "bytes", len(req))
		return
	}
	if s.debug {
		s.log.Debug("fuse request", "opcode", h.Opcode, "unique", h.Unique, "node", h.NodeId, "bytes", len(req))
	}
	ctx := context.Background()
	errno := syscall.ENOSYS
	var out, data []byte
	switch h.Opcode {
	case opForget, opBatchForget, opInterrupt, opNotifyReply:
		return // no reply: the nodes are fixed, and every request is answered promptly
	case opInit:
		s.init(req, h)
		return
	case opDestroy, opRelease, opReleasedir, opFsyncdir:
		errno = 0
	case opLookup:
		name, _, _ := cutNUL(req[inHeaderSize:])
		if h.NodeId != rootNode || name != VolumeName {
			errno = syscall.ENOENT
			break
		}
		e := fuse.EntryOut{NodeId: fileNode, Generation: 1}
		e.SetEntryTimeout(attrForever)
		e.SetAttrTimeout(attrForever)
		s.attr(fileNode, &e.Attr)
		out, errno = bytesOf(&e), 0
	case opGetattr:
		var a fuse.AttrOut
		if errno = s.attr(h.NodeId, &a.Attr); errno == 0 {
			a.SetTimeout(attrForever)
			out = bytesOf(&a)
		}
	case opSetattr:
		r, ok := in[fuse.SetAttrIn](req)
		switch {
		case !ok:
			errno = syscall.EINVAL
		case h.NodeId != fileNode:
			errno = syscall.EPERM
		default:
			var a fuse.AttrOut
			if errno = s.vol.Setattr(ctx, nil, r, &a); errno == 0 {
				a.Ino = fileNode
				a.SetTimeout(attrForever)
				out = bytesOf(&a)
			}
		}
	case opOpen:
		r, ok := in[fuse.OpenIn](req)
		switch {
		case !ok:
			errno = syscall.EINVAL
		case h.NodeId != fileNode:
			errno = syscall.EISDIR
		default:
			fh, flags, e := s.vol.Open(ctx, r.Flags)
			o := fuse.OpenOut{Fh: fhReadOnly, OpenFlags: flags}
			if fh.(*handle).writable {
				o.Fh = fhWritable
			}
			out, errno = bytesOf(&o), e
		}
	case opOpendir:
		if h.NodeId != rootNode {
			errno = syscall.ENOTDIR
			break
		}
		o := fuse.OpenOut{}
		out, errno = bytesOf(&o), 0
	case opReaddir:
		r, ok := in[fuse.ReadIn](req)
		if !ok || h.NodeId != rootNode {
			errno = syscall.EINVAL
			break
		}
		data, errno = readdir(r.Offset, int(r.Size)), 0
	case opRead:
		r, ok := in[fuse.ReadIn](req)
		if !ok || h.NodeId != fileNode {
			errno = syscall.EINVAL
			break
		}
		var dest []byte // a READ request is far shorter than a page
		if int(r.Size) <= len(buf)-pageSize {
			dest = buf[pageSize : pageSize+int(r.Size)]
		} else {
			dest = make([]byte, r.Size)
		}
		res, e := s.vol.Read(ctx, nil, dest, int64(r.Offset))
		if errno = e; errno == 0 {
			var st fuse.Status
			if data, st = res.Bytes(dest); !st.Ok() {
				errno = syscall.EIO
			}
		}
	case opWrite:
		r, ok := in[fuse.WriteIn](req)
		off := int(unsafe.Sizeof(fuse.WriteIn{}))
		if !ok || h.NodeId != fileNode || len(req) < off+int(r.Size) {
			errno = syscall.EINVAL
			break
		}
		n, e := s.vol.Write(ctx, nil, req[off:off+int(r.Size)], int64(r.Offset))
		w := fuse.WriteOut{Size: n}
		out, errno = bytesOf(&w), e
	case opFsync:
		if h.NodeId != fileNode {
			errno = 0
			break
		}
		errno = s.vol.Fsync(ctx, rwHandle, 0)
	case opFlush:
		r, ok := in[fuse.FlushIn](req)
		if !ok || h.NodeId != fileNode {
			errno = 0
			break
		}
		fh := rwHandle
		if r.Fh == fhReadOnly {
			fh = roHandle
		}
		errno = s.vol.Flush(ctx, fh)
	case opStatfs:
		st := fuse.StatfsOut{Bsize: pageSize, Frsize: pageSize, NameLen: 255}
		out, errno = bytesOf(&st), 0
	}
	s.reply(h.Unique, errno, out, data)
}

// init answers FUSE_INIT, which comes only on a fresh mount: an adopted connection was
// initialised by the server that mounted it.
func (s *server) init(req []byte, h *fuse.InHeader) {
	r, ok := in[fuse.InitIn](req)
	if !ok || r.Major != 7 {
		// Tell the kernel our major; it gives up on the connection.
		o := fuse.InitOut{Major: 7, Minor: protocolMinor}
		s.reply(h.Unique, 0, bytesOf(&o), nil)
		return
	}
	o := fuse.InitOut{
		Major:               7,
		Minor:               min(r.Minor, protocolMinor),
		MaxReadAhead:        min(r.MaxReadAhead, maxReadAhead),
		Flags:               r.Flags & initFlags,
		MaxBackground:       maxBackground,
		CongestionThreshold: maxBackground * 3 / 4,
		MaxWrite:            uint32(s.maxWrite),
		TimeGran:            1,
		MaxPages:            uint16(s.maxWrite / pageSize),
	}
	s.reply(h.Unique, 0, bytesOf(&o), nil)
	s.initOnce.Do(func() { close(s.inited) })
}

// attr fills a's attributes of node.
func (s *server) attr(node uint64, a *fuse.Attr) syscall.Errno {
	switch node {
	case rootNode:
		a.Ino, a.Mode, a.Nlink, a.Blksize = rootNode, syscall.S_IFDIR|0o700, 2, pageSize
		a.SetTimes(nil, &s.vol.mtime, &s.vol.mtime)
	case fileNode:
		s.vol.fill(a)
		a.Ino = fileNode
	default:
		return syscall.ENOENT
	}
	return 0
}

// readdir lists the root: ".", ".." and the file, from entry off on, as many as fit in size
// bytes of fuse_dirent records.
func readdir(off uint64, size int) []byte {
	entries := []struct {
		ino  uint64
		typ  uint32
		name string
	}{{rootNode, syscall.DT_DIR, "."}, {rootNode, syscall.DT_DIR, ".."}, {fileNode, syscall.DT_REG, VolumeName}}
	var b []byte
	for i := off; i < uint64(len(entries)); i++ {
		e := entries[i]
		rec := 24 + (len(e.name)+7)&^7
		if len(b)+rec > size {
			break
		}
		d := make([]byte, rec)
		*(*uint64)(unsafe.Pointer(&d[0])) = e.ino
		*(*uint64)(unsafe.Pointer(&d[8])) = i + 1 // the offset of the next entry
		*(*uint32)(unsafe.Pointer(&d[16])) = uint32(len(e.name))
		*(*uint32)(unsafe.Pointer(&d[20])) = e.typ
		copy(d[24:], e.name)
		b = append(b, d...)
	}
	return b
}

func cutNUL(b []byte) (string, []byte, bool) {
	for i, c := range b {
		if c == 0 {
			return string(b[:i]), b[i+1:], true
		}
	}
	return string(b), nil, false
}

var outHeaderSize = int(unsafe.Sizeof(fuse.OutHeader{}))

// reply answers request unique: an error alone, or out and data after the header.
func (s *server) reply(unique uint64, errno syscall.Errno, out, data []byte) {
	hdr := fuse.OutHeader{Unique: unique, Status: -int32(errno)}
	iov := [][]byte{bytesOf(&hdr)}
	if errno == 0 {
		iov = append(iov, out, data)
	}
	n := 0
	for _, b := range iov {
		n += len(b)
	}
	hdr.Length = uint32(n)
	if _, err := unix.Writev(s.fd, iov); err != nil && !errors.Is(err, unix.ENOENT) {
		// ENOENT: the request was interrupted and is gone. ENODEV: the connection ended.
		if !errors.Is(err, unix.ENODEV) {
			s.log.Error("FUSE server: reply failed", "unique", unique, "err", err)
		}
	}
}

// notify sends an unsolicited message (unique 0) with the notify code in the error field.
// go-fuse's NOTIFY_* constants are the codes negated.
func (s *server) notify(code int32, body []byte) error {
	hdr := fuse.OutHeader{Length: uint32(outHeaderSize + len(body)), Status: -code}
	if _, err := unix.Writev(s.fd, [][]byte{bytesOf(&hdr), body}); err != nil {
		return err
	}
	return nil
}

// resend asks the kernel to send again every request a previous server of the connection
// had read but not answered (Linux 6.9+): without it, a FSYNC a killed server had taken
// would never complete.
func (s *server) resend() error {
	return s.notify(fuse.NOTIFY_RESEND, nil)
}

// invalidateAttrs drops the kernel's cached attributes of the file (offset -1: attributes
// only; it has no page cache).
func (s *server) invalidateAttrs() error {
	n := fuse.NotifyInvalInodeOut{Ino: fileNode, Off: -1}
	return s.notify(fuse.NOTIFY_INVAL_INODE, bytesOf(&n))
}
