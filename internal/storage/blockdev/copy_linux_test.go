package blockdev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// mountCopy starts a process holding a private copy of this mount namespace's mount table,
// as a container runtime or a tool that unshares its mounts does, and returns once the copy
// has every one of dirs mounted. The process is killed when the test ends.
func mountCopy(t *testing.T, dirs ...string) {
	t.Helper()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "600")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	table := fmt.Sprintf("/proc/%d/mountinfo", cmd.Process.Pid)
	wait.Eventually(t, 30*time.Second, "the copy of the mount table", func(context.Context) (bool, error) {
		b, err := os.ReadFile(table)
		if err != nil {
			return false, err
		}
		// unshare execs sleep once the namespace is made: until then the table is ours.
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", cmd.Process.Pid)); err != nil || filepath.Base(exe) != "sleep" {
			return false, fmt.Errorf("unshare has not started sleep yet (%s, %v)", exe, err)
		}
		for _, d := range dirs {
			if !strings.Contains(string(b), " "+d+" ") {
				return false, fmt.Errorf("%s is not in the copy", d)
			}
		}
		return true, nil
	})
}

// closeBound is how long Close and Terminate may take in these tests: their CloseTimeout,
// and as much again for the rest.
const closeBound = 2 * copyCloseTimeout

const copyCloseTimeout = 3 * time.Second

// TestCloseEndsACopiedMount: a process made a private copy of the mount table while the
// volume was exported, so the FUSE file system lives on in that copy after Close unmounts
// it here. Close must end the connection itself, within closeBound, instead of failing with
// "did not stop after unmount" while the copy's process lives.
func TestCloseEndsACopiedMount(t *testing.T) {
	requireMount(t, "unshare", "sleep")
	dev := newFileDevice(t, filepath.Join(t.TempDir(), "backing.img"), 4<<20)
	dir := filepath.Join(t.TempDir(), "export")
	e, err := Export(context.Background(), dev, dir, Options{Logger: quietLogger(), CloseTimeout: copyCloseTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Cleanup(dir) })
	f, err := os.OpenFile(e.Device(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("before the copy"), 0); err != nil {
		t.Fatal(err)
	}
	f.Close() // the last close of a block device writes its cache back
	mountCopy(t, dir)

	start := time.Now()
	err = e.Close()
	took := time.Since(start)
	if err != nil {
		t.Fatalf("close with a copy of the mount in another namespace (after %s): %v", took.Round(time.Millisecond), err)
	}
	if took > closeBound {
		t.Fatalf("close took %s, want at most %s", took, closeBound)
	}
	select {
	case <-e.Done():
	default:
		t.Fatal("the FUSE server still serves after Close")
	}
	if !fileContains(t, dev.f.Name(), 0, []byte("before the copy")) {
		t.Fatal("what was written before Close is not on the device")
	}
	if isMountPoint(t, dir) {
		t.Fatal("still mounted here after Close")
	}
	t.Logf("closed in %s", took.Round(time.Millisecond))
}

// TestTerminateEndsACopiedFileSystem: the copy holds the file system on the loop device
// too, so the loop device is never released while the copy's process lives. Terminate
// (NodeUnstageVolume's stop) writes what this namespace wrote through the loop device to the
// Device, then ends the connection: it returns within closeBound, the server has stopped,
// the write is on the Device, and the copy's file system fails with EIO instead of
// hanging.
func TestTerminateEndsACopiedFileSystem(t *testing.T) {
	requireMount(t, "unshare", "sleep", "mkfs.ext4", "mount")
	dev := newFileDevice(t, filepath.Join(t.TempDir(), "backing.img"), 32<<20)
	dir := filepath.Join(t.TempDir(), "export")
	e, err := Export(context.Background(), dev, dir, Options{Logger: quietLogger(), CloseTimeout: copyCloseTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Cleanup(dir) })
	command(t, "mkfs.ext4", "-q", "-F", e.Device())
	fs := mountFS(t, e.Device())
	if err := os.WriteFile(filepath.Join(fs, "f"), []byte("staged"), 0o600); err != nil {
		t.Fatal(err)
	}
	mountCopy(t, dir, fs)
	// NodeUnstageVolume flushes the file system, then unmounts it here: the copy keeps it.
	command(t, "sync", "-f", fs)
	if err := unix.Unmount(fs, 0); err != nil {
		t.Fatal(err)
	}
	// Written around the file system, into the loop device's cache: what a file system that
	// lives on only in the copy would leave there. Terminate must flush it before the end.
	at := int64(31 << 20)
	held, err := os.OpenFile(e.Device(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := held.WriteAt([]byte("cached in the loop device"), at); err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- e.Terminate() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("terminate with the file system alive in another namespace: %v", err)
		}
	case <-time.After(closeBound):
		t.Fatalf("terminate still running after %s", closeBound)
	}
	took := time.Since(start)
	select {
	case <-e.Done():
	default:
		t.Fatal("the FUSE server still serves after Terminate")
	}
	if !fileContains(t, dev.f.Name(), at, []byte("cached in the loop device")) {
		t.Fatal("a write in the loop device's cache did not reach the device before the connection ended")
	}
	// The connection is gone: I/O through the loop device fails rather than waits.
	if _, err := held.WriteAt([]byte("after"), at); err == nil {
		if err = held.Sync(); !errors.Is(err, syscall.EIO) {
			t.Fatalf("sync through the loop device after Terminate: %v, want EIO", err)
		}
	}
	t.Logf("terminated in %s", took.Round(time.Millisecond))
}
