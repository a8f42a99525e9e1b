package blockdev

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/testenv/require"
)

// requireMount skips a test that needs real mounts when this host cannot do them, unless
// CRDIPC_REQUIRE_MOUNT=1 (CI on capable hosts), where a missing capability is a failure.
// The tools the tests drive count as part of the capability.
func requireMount(t *testing.T, tools ...string) {
	t.Helper()
	err := Available()
	if err == nil {
		err = require.Missing(tools...)
	}
	require.Capable(t, "CRDIPC_REQUIRE_MOUNT", err)
}

// fileDevice is a Device backed by a regular file; it counts Flush calls and can be told to
// fail writes or reads.
type fileDevice struct {
	f          *os.File
	size       int64
	flushes    atomic.Int64
	writes     atomic.Int64
	failWrites atomic.Bool
	failReads  atomic.Bool
}

func newFileDevice(t *testing.T, path string, size int64) *fileDevice {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return &fileDevice{f: f, size: size}
}

var errInjected = errors.New("injected device failure")

func (d *fileDevice) ReadAt(p []byte, off int64) (int, error) {
	if d.failReads.Load() {
		return 0, errInjected
	}
	return d.f.ReadAt(p, off)
}

func (d *fileDevice) WriteAt(p []byte, off int64) (int, error) {
	if d.failWrites.Load() {
		return 0, errInjected
	}
	d.writes.Add(1)
	return d.f.WriteAt(p, off)
}

func (d *fileDevice) Flush() error {
	d.flushes.Add(1)
	return d.f.Sync()
}

func (d *fileDevice) Size() int64 { return d.size }

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// export exports dev under a fresh temporary directory and closes it when the test ends.
func export(t *testing.T, dev Device, o Options) *Exported {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quietLogger()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := Export(ctx, dev, filepath.Join(t.TempDir(), "export"), o)
	if err != nil {
		t.Fatalf("export: %v", err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close export: %v", err)
		}
	})
	return e
}

// command runs a command and fails the test with its output if it fails.
func command(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// mountFS mounts a block device at a fresh directory and unmounts it when the test ends
// (if the test did not already).
func mountFS(t *testing.T, dev string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "fs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	command(t, "mount", dev, dir)
	t.Cleanup(func() { _ = unix.Unmount(dir, 0) })
	return dir
}

// isMountPoint reads the mount table, which works even on a dead FUSE mount.
func isMountPoint(t *testing.T, dir string) bool {
	t.Helper()
	ms, err := mountsAt(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(ms) > 0
}

// loopReleased holds once the loop device dev no longer serves file.
func loopReleased(dev, file string) func(context.Context) (bool, error) {
	return func(context.Context) (bool, error) {
		if bf, ok := loopBackingFile(filepath.Base(dev)); ok && bf == file {
			return false, fmt.Errorf("%s still backed by %s", dev, bf)
		}
		return true, nil
	}
}

func fileContains(t *testing.T, path string, off int64, want []byte) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, off); err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(got, want)
}
