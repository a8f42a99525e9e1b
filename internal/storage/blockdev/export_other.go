//go:build !linux

package blockdev

import (
	"context"
	"errors"
	"fmt"
	"runtime"
)

// Available always fails off Linux: the export needs the Linux loop driver.
func Available() error {
	return fmt.Errorf("%w: the loop driver (GOOS %s is not linux)", ErrUnavailable, runtime.GOOS)
}

// Exported is a Device served as a FUSE file and attached to a loop device (Linux only).
type Exported struct{}

// Export fails off Linux; see Available.
func Export(ctx context.Context, dev Device, dir string, o Options) (*Exported, error) {
	return nil, Available()
}

// Resize grows the export; it fails off Linux, as Export does.
func (e *Exported) Resize(size int64) error { return Available() }

// Device is the loop device.
func (e *Exported) Device() string { return "" }

// File is the FUSE file the loop device is bound to.
func (e *Exported) File() string { return "" }

// DirectIO reports whether the loop driver does direct I/O on the file.
func (e *Exported) DirectIO() bool { return false }

// Done is closed when the FUSE server has stopped serving.
func (e *Exported) Done() <-chan struct{} { return nil }

// Close detaches and unmounts; there is nothing to do off Linux.
func (e *Exported) Close() error { return nil }

// Terminate is Close that ends the connection whoever still uses it; nothing off Linux.
func (e *Exported) Terminate() error { return nil }

// Cleanup removes a stale export; there is none off Linux.
func Cleanup(dir string) error { return nil }

// ErrNoExport is wrapped by Exists and Adopt when dir holds no export to adopt.
var ErrNoExport = errors.New("no export to adopt")

// Exists reports that there is no export off Linux.
func Exists(dir, loop string) error { return fmt.Errorf("%w: %v", ErrNoExport, Available()) }

// Adopt fails off Linux; see Available.
func Adopt(ctx context.Context, dev Device, dir, loop string, conn int, o Options) (*Exported, error) {
	return nil, Available()
}

// Conn fails off Linux.
func (e *Exported) Conn() (int, error) { return -1, Available() }

// Release does nothing off Linux.
func (e *Exported) Release() error { return nil }
