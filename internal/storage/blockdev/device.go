package blockdev

import (
	"errors"
	"log/slog"
	"time"
)

// Device is the storage behind an export: an array of bytes, whose size may only grow
// (Exported.Resize).
//
// The FUSE server serves kernel requests on many goroutines at once, so every method may be
// called concurrently with every other; a Device must be safe for concurrent use. Concurrent
// writes to overlapping ranges are ordered by nobody (as on a disk): the file system above
// the loop device does not issue them.
//
// ReadAt and WriteAt follow io.ReaderAt and io.WriterAt: a short count comes with a non-nil
// error, and p must not be retained after the call returns (the FUSE server reuses it).
// Every error becomes EIO for the kernel; the export logs the original.
type Device interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	// Flush makes every write that WriteAt has acknowledged durable. The kernel asks for it
	// when the file system above commits (fsync, sync, a journal commit): see doc.go.
	Flush() error
	// Size is the volume size in bytes. It is read at Export; Exported.Resize checks that
	// the Device holds at least the size it is given.
	Size() int64
}

// DirectIOMode selects how the loop driver reads and writes the FUSE file.
type DirectIOMode int

const (
	// DirectIOAuto asks for direct I/O and falls back to buffered I/O if the kernel refuses.
	DirectIOAuto DirectIOMode = iota
	// DirectIOOn requires direct I/O; Export fails without it.
	DirectIOOn
	// DirectIOOff attaches the loop device with buffered I/O.
	DirectIOOff
)

func (m DirectIOMode) String() string {
	switch m {
	case DirectIOAuto:
		return "auto"
	case DirectIOOn:
		return "on"
	case DirectIOOff:
		return "off"
	}
	return "invalid"
}

// Options tune an export. The zero value is what production should use.
type Options struct {
	// MaxWrite is the largest read or write request the kernel sends to the FUSE server.
	// Zero means 1 MiB, which is also the kernel's ceiling: fewer, larger requests are what
	// sequential throughput depends on.
	MaxWrite int
	// DirectIO selects the loop device's I/O mode (default DirectIOAuto).
	DirectIO DirectIOMode
	// CloseTimeout bounds how long Close waits for the loop device to release the file and
	// for the FUSE mount to unmount cleanly before it unmounts lazily. Zero means 10s.
	CloseTimeout time.Duration
	// Logger receives the Device errors that the kernel only sees as EIO, and lifecycle
	// events. Nil means slog.Default().
	Logger *slog.Logger
	// Debug logs every FUSE request; very verbose.
	Debug bool
}

const (
	defaultMaxWrite     = 1 << 20
	defaultCloseTimeout = 10 * time.Second
	// maxReadAhead only matters for buffered reads of the FUSE file, which FOPEN_DIRECT_IO
	// rules out; 128 KiB is the kernel's cap, so a stray buffered reader still gets
	// full-size requests.
	maxReadAhead = 128 << 10
	// maxBackground bounds the asynchronous requests (direct-I/O chunks from the loop
	// driver) the kernel keeps in flight; the default of 12 starves a Device whose
	// latency is a network round trip.
	maxBackground = 64
)

// VolumeName is the name of the single file in an export's FUSE mount.
const VolumeName = "volume"

var (
	// ErrUnavailable is wrapped by Available (and Export) when this host cannot export.
	ErrUnavailable = errors.New("block device export unavailable")
	// ErrBusy is wrapped by Close when the loop device or the mount was still in use at
	// the deadline: the export was detached lazily and is served until its last user
	// closes it (see Export.Done).
	ErrBusy = errors.New("export still in use")
)

func (o Options) withDefaults() Options {
	if o.MaxWrite <= 0 || o.MaxWrite > defaultMaxWrite {
		o.MaxWrite = defaultMaxWrite
	}
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = defaultCloseTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}
