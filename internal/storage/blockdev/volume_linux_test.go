package blockdev

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// These tests call the FUSE handlers directly, so they run without mounts.

// shortDevice wraps a Device to return bad answers on demand.
type shortDevice struct {
	*fileDevice
	shortWrite, errOnFullRead, failFlush bool
}

func (d *shortDevice) WriteAt(p []byte, off int64) (int, error) {
	if d.shortWrite {
		return len(p) / 2, nil // breaks the io.WriterAt contract: must become EIO
	}
	return d.fileDevice.WriteAt(p, off)
}

func (d *shortDevice) ReadAt(p []byte, off int64) (int, error) {
	n, err := d.fileDevice.ReadAt(p, off)
	if d.errOnFullRead && err == nil {
		err = errInjected
	}
	return n, err
}

func (d *shortDevice) Flush() error {
	if d.failFlush {
		return errInjected
	}
	return d.fileDevice.Flush()
}

func newTestVolume(t *testing.T, size int64) (*volume, *fileDevice) {
	dev := newFileDevice(t, filepath.Join(t.TempDir(), "backing.img"), size)
	return newVolume(dev, quietLogger()), dev
}

func readAll(t *testing.T, r fuse.ReadResult) []byte {
	t.Helper()
	b, st := r.Bytes(make([]byte, r.Size()))
	if !st.Ok() {
		t.Fatalf("read result: %v", st)
	}
	return b
}

func TestVolumeReadClampsAtEnd(t *testing.T) {
	ctx := context.Background()
	v, _ := newTestVolume(t, 4096)
	if _, errno := v.Write(ctx, nil, []byte("abcdefgh"), 4088); errno != 0 {
		t.Fatal(errno)
	}
	r, errno := v.Read(ctx, nil, make([]byte, 100), 4090)
	if errno != 0 || string(readAll(t, r)) != "cdefgh" {
		t.Fatalf("read across the end: %v %q", errno, readAll(t, r))
	}
	r, errno = v.Read(ctx, nil, make([]byte, 100), 4096)
	if errno != 0 || r.Size() != 0 {
		t.Fatalf("read at the end: %v, %d bytes; want EOF (0 bytes)", errno, r.Size())
	}
	if _, errno := v.Read(ctx, nil, make([]byte, 1), -1); errno != syscall.EINVAL {
		t.Fatalf("read at -1: %v, want EINVAL", errno)
	}
}

func TestVolumeWriteClampsAtEnd(t *testing.T) {
	ctx := context.Background()
	v, _ := newTestVolume(t, 4096)
	if n, errno := v.Write(ctx, nil, make([]byte, 200), 4000); errno != 0 || n != 96 {
		t.Fatalf("write across the end: %d, %v; want 96 bytes", n, errno)
	}
	if _, errno := v.Write(ctx, nil, []byte("x"), 4096); errno != syscall.EFBIG {
		t.Fatalf("write at the end: %v, want EFBIG", errno)
	}
	if _, errno := v.Write(ctx, nil, []byte("x"), -1); errno != syscall.EINVAL {
		t.Fatalf("write at -1: %v, want EINVAL", errno)
	}
	if n, errno := v.Write(ctx, nil, nil, 5000); errno != 0 || n != 0 {
		t.Fatalf("empty write: %d, %v", n, errno)
	}
}

func TestVolumeDeviceErrorsAreEIO(t *testing.T) {
	ctx := context.Background()
	v, fd := newTestVolume(t, 4096)
	sd := &shortDevice{fileDevice: fd}
	v.dev = sd

	fd.failWrites.Store(true)
	if _, errno := v.Write(ctx, nil, []byte("x"), 0); errno != syscall.EIO {
		t.Fatalf("failing write: %v, want EIO", errno)
	}
	fd.failWrites.Store(false)
	sd.shortWrite = true
	if _, errno := v.Write(ctx, nil, []byte("xx"), 0); errno != syscall.EIO {
		t.Fatalf("short write without error: %v, want EIO", errno)
	}
	sd.shortWrite = false

	fd.failReads.Store(true)
	if _, errno := v.Read(ctx, nil, make([]byte, 1), 0); errno != syscall.EIO {
		t.Fatalf("failing read: %v, want EIO", errno)
	}
	fd.failReads.Store(false)
	sd.errOnFullRead = true
	if _, errno := v.Read(ctx, nil, make([]byte, 1), 0); errno != syscall.EIO {
		t.Fatalf("full read with a non-EOF error: %v, want EIO", errno)
	}
	sd.errOnFullRead = false

	sd.failFlush = true
	if errno := v.Fsync(ctx, &handle{writable: true}, 0); errno != syscall.EIO {
		t.Fatalf("fsync with a failing flush: %v, want EIO", errno)
	}
	if errno := v.Flush(ctx, &handle{writable: true}); errno != syscall.EIO {
		t.Fatalf("close with a failing flush: %v, want EIO", errno)
	}
}

// A full read that ends exactly at the end of the Device may come with io.EOF (io.ReaderAt
// allows that); it is a success.
func TestVolumeFullReadWithEOF(t *testing.T) {
	v := newVolume(&MemoryDevice{buf: []byte("0123456789abcdef")}, quietLogger())
	r, errno := v.Read(context.Background(), nil, make([]byte, 8), 8)
	if errno != 0 || string(readAll(t, r)) != "89abcdef" {
		t.Fatalf("read of the last bytes: %v", errno)
	}
}

func TestVolumeFlushOnlyForWriters(t *testing.T) {
	ctx := context.Background()
	v, dev := newTestVolume(t, 4096)
	fh, flags, errno := v.Open(ctx, syscall.O_RDONLY)
	if errno != 0 || flags&fuse.FOPEN_DIRECT_IO == 0 {
		t.Fatalf("open: %v, flags %#x; want FOPEN_DIRECT_IO", errno, flags)
	}
	v.Flush(ctx, fh)
	if n := dev.flushes.Load(); n != 0 {
		t.Fatalf("closing a read-only handle flushed the device %d times", n)
	}
	fh, _, _ = v.Open(ctx, syscall.O_RDWR)
	v.Flush(ctx, fh)
	if n := dev.flushes.Load(); n != 1 {
		t.Fatalf("closing a writable handle flushed %d times, want 1", n)
	}
	v.Fsync(ctx, fh, 0)
	if n := dev.flushes.Load(); n != 2 {
		t.Fatalf("fsync flushed %d times in all, want 2", n)
	}
}

func TestVolumeSizeIsFixed(t *testing.T) {
	ctx := context.Background()
	v, _ := newTestVolume(t, 4096)
	var out fuse.AttrOut
	in := &fuse.SetAttrIn{}
	in.Valid = fuse.FATTR_SIZE
	in.Size = 8192
	if errno := v.Setattr(ctx, nil, in, &out); errno != syscall.EINVAL {
		t.Fatalf("grow: %v, want EINVAL", errno)
	}
	in.Size = 4096
	if errno := v.Setattr(ctx, nil, in, &out); errno != 0 || out.Size != 4096 {
		t.Fatalf("set the same size: %v, size %d", errno, out.Size)
	}
}

func TestParseMountInfo(t *testing.T) {
	m, ok := parseMountInfo(`2109 29 0:120 / /var/lib/kubelet/a\040b/export rw,nosuid,nodev,relatime shared:1 - fuse.crdipc crdipc-blockdev rw,user_id=0,group_id=0`)
	if !ok {
		t.Fatal("not parsed")
	}
	if m.mountPoint != "/var/lib/kubelet/a b/export" || m.fsType != "fuse.crdipc" || !isFUSE(m) {
		t.Fatalf("parsed %+v", m)
	}
	if m.dev != 120 {
		t.Fatalf("dev %d, want 0:120", m.dev)
	}
	if _, ok := parseMountInfo("garbage"); ok {
		t.Fatal("garbage parsed")
	}
}

func TestOptionsDefaults(t *testing.T) {
	o := Options{MaxWrite: 64 << 20}.withDefaults()
	if o.MaxWrite != defaultMaxWrite || o.CloseTimeout != defaultCloseTimeout || o.Logger == nil {
		t.Fatalf("defaults: %+v", o)
	}
}
