package blockdev

import (
	"io"
	"sync"
)

// MemoryDevice is a Device held in memory. Exported, it is what the FUSE file, the loop
// device and a file system on it allow when the Device costs nothing: the ceiling of any
// Device behind Export (crdipc bench volume measures it), and a stand-in in tests.
type MemoryDevice struct {
	mu  sync.RWMutex
	buf []byte
}

// NewMemoryDevice returns a zeroed device of size bytes (a positive multiple of 512 to be
// exported).
func NewMemoryDevice(size int64) *MemoryDevice { return &MemoryDevice{buf: make([]byte, size)} }

// ReadAt reads from memory; past the end it returns io.EOF.
func (d *MemoryDevice) ReadAt(p []byte, off int64) (int, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if off >= int64(len(d.buf)) {
		return 0, io.EOF
	}
	n := copy(p, d.buf[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt writes to memory; Export never writes past the end.
func (d *MemoryDevice) WriteAt(p []byte, off int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if off >= int64(len(d.buf)) {
		return 0, io.ErrShortWrite
	}
	n := copy(d.buf[off:], p)
	if n < len(p) {
		return n, io.ErrShortWrite
	}
	return n, nil
}

// Flush has nothing to make durable.
func (d *MemoryDevice) Flush() error { return nil }

// Size is the device's size.
func (d *MemoryDevice) Size() int64 { return int64(len(d.buf)) }
