package blockdev

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// volume is the exported file: a regular file of a fixed size whose reads and writes go
// straight to the Device. Its methods have go-fuse's node signatures; server calls them.
type volume struct {
	dev Device
	// size only grows (Exported.Resize); every request reads it.
	size  atomic.Int64
	mtime time.Time
	log   *slog.Logger
}

// handle remembers whether an open file may have written, so that closing a read-only
// descriptor (a backup tool reading the file, say) does not cost a Device flush.
type handle struct {
	writable bool
}

var (
	_ fs.NodeOpener    = (*volume)(nil)
	_ fs.NodeGetattrer = (*volume)(nil)
	_ fs.NodeSetattrer = (*volume)(nil)
	_ fs.NodeReader    = (*volume)(nil)
	_ fs.NodeWriter    = (*volume)(nil)
	_ fs.NodeFsyncer   = (*volume)(nil)
	_ fs.NodeFlusher   = (*volume)(nil)
)

func newVolume(dev Device, log *slog.Logger) *volume {
	v := &volume{dev: dev, mtime: time.Now(), log: log}
	v.size.Store(dev.Size())
	return v
}

// Open hands out FOPEN_DIRECT_IO handles: with no page cache in the FUSE layer, a write the
// loop driver completes has been acknowledged by Device.WriteAt, and no stale cached page
// can hide what the Device holds. PARALLEL_DIRECT_WRITES lets the kernel send concurrent
// writes instead of serialising them on the inode lock; that is safe because writes never
// change the file's size (only Exported.Resize does).
func (v *volume) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	h := &handle{writable: flags&syscall.O_ACCMODE != syscall.O_RDONLY}
	return h, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_PARALLEL_DIRECT_WRITES, 0
}

func (v *volume) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	v.fill(&out.Attr)
	return 0
}

// Setattr accepts everything but a size change: the volume's size is the Device's, changed
// only by Exported.Resize. Setting the current size is allowed because some tools
// "truncate" to the size they found.
func (v *volume) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok && int64(sz) != v.size.Load() {
		return syscall.EINVAL
	}
	v.fill(&out.Attr)
	return 0
}

func (v *volume) fill(a *fuse.Attr) {
	size := uint64(v.size.Load())
	a.Mode = syscall.S_IFREG | 0o600
	a.Size = size
	a.Blocks = (size + 511) / 512
	a.Blksize = 4096
	a.Nlink = 1
	a.SetTimes(nil, &v.mtime, &v.mtime)
}

// Read clamps at the end of the volume (a read there returns 0 bytes, which is EOF).
func (v *volume) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	if off < 0 {
		return nil, syscall.EINVAL
	}
	size := v.size.Load()
	if off >= size {
		return fuse.ReadResultData(nil), 0
	}
	p := dest[:min(int64(len(dest)), size-off)]
	n, err := v.dev.ReadAt(p, off)
	// io.ReaderAt may return io.EOF along with a full read at the very end.
	if err != nil && !(errors.Is(err, io.EOF) && n == len(p)) {
		v.log.Warn("device read failed; returning EIO", "offset", off, "length", len(p), "err", err)
		return nil, syscall.EIO
	}
	if n != len(p) {
		v.log.Warn("device read short without error; returning EIO", "offset", off, "length", len(p), "read", n)
		return nil, syscall.EIO
	}
	return fuse.ReadResultData(p), 0
}

// Write refuses to grow the file: a write starting at or past the end fails with EFBIG and
// one crossing the end is cut short there, as write(2) does at a file size limit.
func (v *volume) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	if off < 0 {
		return 0, syscall.EINVAL
	}
	if len(data) == 0 {
		return 0, 0
	}
	size := v.size.Load()
	if off >= size {
		return 0, syscall.EFBIG
	}
	p := data[:min(int64(len(data)), size-off)]
	n, err := v.dev.WriteAt(p, off)
	if err != nil || n != len(p) {
		v.log.Warn("device write failed; returning EIO", "offset", off, "length", len(p), "written", n, "err", err)
		return 0, syscall.EIO
	}
	return uint32(n), 0
}

// Fsync is how durability requests arrive: the loop driver turns a flush of the block
// device (a journal commit, sync(2), fsync on a file above) into fsync of this file.
// fdatasync is treated the same, since the Device has no metadata to skip.
func (v *volume) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	return v.flush("fsync")
}

// Flush runs on every close(2) of a descriptor. Closing a writable one flushes the Device,
// so a tool writing the file directly (dd without conv=fsync) still leaves durable data.
func (v *volume) Flush(ctx context.Context, f fs.FileHandle) syscall.Errno {
	if h, ok := f.(*handle); ok && !h.writable {
		return 0
	}
	return v.flush("close")
}

func (v *volume) flush(why string) syscall.Errno {
	if err := v.dev.Flush(); err != nil {
		v.log.Warn("device flush failed; returning EIO", "on", why, "err", err)
		return syscall.EIO
	}
	return 0
}
