package blockdev

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// TestExt4SyncReachesDevice is the data-path contract end to end: a file system on the loop
// device, a sync, and then the Device must hold everything — both as a crash would find it
// (a copy taken right after sync, journal replayed by e2fsck) and after a clean
// unmount/close/re-export from the same backing file.
//
// Both loop modes are covered: buffered loop I/O must be just as safe, because the FUSE file
// is FOPEN_DIRECT_IO either way.
func TestExt4SyncReachesDevice(t *testing.T) {
	requireMount(t, "mkfs.ext4", "mount", "sync", "e2fsck", "debugfs", "cp")
	for _, mode := range []DirectIOMode{DirectIOAuto, DirectIOOff} {
		t.Run("directio="+mode.String(), func(t *testing.T) { testExt4SyncReachesDevice(t, mode) })
	}
}

func testExt4SyncReachesDevice(t *testing.T, mode DirectIOMode) {
	const size = 96 << 20
	backing := filepath.Join(t.TempDir(), "backing.img")
	dev := newFileDevice(t, backing, size)
	e := export(t, dev, Options{DirectIO: mode})
	t.Logf("exported on %s (loop direct I/O: %v)", e.Device(), e.DirectIO())
	if mode == DirectIOOff && e.DirectIO() {
		t.Fatal("loop device does direct I/O although DirectIOOff was asked for")
	}

	command(t, "mkfs.ext4", "-q", "-F", e.Device())
	mnt := mountFS(t, e.Device())

	data := make([]byte, 32<<20)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(data)
	want := sha256.Sum256(data)
	if err := os.WriteFile(filepath.Join(mnt, "data"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	before := dev.flushes.Load()
	command(t, "sync")
	if got := dev.flushes.Load(); got <= before {
		t.Fatalf("sync did not flush the device (flushes %d before, %d after)", before, got)
	}

	// What a crash right now would leave: the backing file as it is, still mounted.
	crash := filepath.Join(t.TempDir(), "crash.img")
	command(t, "cp", "--sparse=always", backing, crash)
	if out, err := exec.Command("e2fsck", "-fy", crash).CombinedOutput(); err != nil {
		// Exit status 1 means "errors corrected", which includes replaying the journal.
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("e2fsck on the post-sync copy: %v\n%s", err, out)
		}
	}
	got, err := exec.Command("debugfs", "-R", "cat /data", crash).Output()
	if err != nil {
		t.Fatalf("debugfs cat /data: %v", err)
	}
	if sha256.Sum256(got) != want {
		t.Fatalf("post-sync copy of the device holds %d bytes of /data with another sha256", len(got))
	}

	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}

	// Re-export the same backing file through a new Device: the file system must be clean
	// and hold the same bytes.
	e2 := export(t, newFileDevice(t, backing, size), Options{DirectIO: mode})
	command(t, "e2fsck", "-fn", e2.Device())
	mnt2 := mountFS(t, e2.Device())
	got, err = os.ReadFile(filepath.Join(mnt2, "data"))
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != want {
		t.Fatalf("re-exported file system holds %d bytes with another sha256", len(got))
	}
}

// TestDirectWriteReachesDevice: a write the loop device completed has reached
// Device.WriteAt, with no flush, because no page cache sits between the two.
func TestDirectWriteReachesDevice(t *testing.T) {
	requireMount(t, "dd")
	backing := filepath.Join(t.TempDir(), "backing.img")
	dev := newFileDevice(t, backing, 16<<20)
	e := export(t, dev, Options{})

	pattern := bytes.Repeat([]byte("crdipc!\n"), 64<<10/8)
	src := filepath.Join(t.TempDir(), "pattern")
	if err := os.WriteFile(src, pattern, 0o600); err != nil {
		t.Fatal(err)
	}
	flushes := dev.flushes.Load()
	command(t, "dd", "if="+src, "of="+e.Device(), "bs=64K", "seek=16", "oflag=direct", "status=none")
	if !fileContains(t, backing, 16*64<<10, pattern) {
		t.Fatal("the write dd completed is not in the backing file")
	}
	t.Logf("flushes during the write: %d", dev.flushes.Load()-flushes)

	// And read back through the loop device.
	out := command(t, "dd", "if="+e.Device(), "bs=64K", "skip=16", "count=1", "iflag=direct", "status=none")
	if out != string(pattern) {
		t.Fatal("reading back through the loop device returned other bytes")
	}
}

// TestDeviceErrorsAreEIO: the kernel sees a failing Device as an I/O error.
func TestDeviceErrorsAreEIO(t *testing.T) {
	requireMount(t, "dd")
	dev := newFileDevice(t, filepath.Join(t.TempDir(), "backing.img"), 16<<20)
	e := export(t, dev, Options{})

	dev.failWrites.Store(true)
	out, err := exec.Command("dd", "if=/dev/zero", "of="+e.Device(), "bs=4K", "count=1", "oflag=direct").CombinedOutput()
	if err == nil {
		t.Fatalf("write through the loop device succeeded on a failing device:\n%s", out)
	}
	if !strings.Contains(string(out), "Input/output error") {
		t.Fatalf("write failed, but not with EIO:\n%s", out)
	}
	dev.failWrites.Store(false)

	dev.failReads.Store(true)
	out, err = exec.Command("dd", "if="+e.Device(), "of=/dev/null", "bs=4K", "count=1", "iflag=direct").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Input/output error") {
		t.Fatalf("read through the loop device on a failing device: err %v, want EIO:\n%s", err, out)
	}
}

// TestFileBounds uses the FUSE file directly: it has the Device's size and cannot grow.
func TestFileBounds(t *testing.T) {
	requireMount(t)
	const size = 1 << 20
	dev := newFileDevice(t, filepath.Join(t.TempDir(), "backing.img"), size)
	e := export(t, dev, Options{})

	fi, err := os.Stat(e.File())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != size {
		t.Fatalf("file size %d, want %d", fi.Size(), size)
	}
	f, err := os.OpenFile(e.File(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	// Crossing the end: the part inside is written (a short write), the rest refused.
	// Raw pwrite(2), because os.File retries short writes.
	n, err := unix.Pwrite(int(f.Fd()), []byte("0123456789"), size-4)
	if n != 4 || err != nil {
		t.Fatalf("write across the end: n=%d err=%v, want 4 bytes written", n, err)
	}
	if _, err := unix.Pwrite(int(f.Fd()), []byte("x"), size); !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("write at the end: %v, want EFBIG", err)
	}
	if !fileContains(t, dev.f.Name(), size-4, []byte("0123")) {
		t.Fatal("the part of the write inside the volume did not reach the device")
	}
	buf := make([]byte, 10)
	n, err = f.ReadAt(buf, size-4)
	if n != 4 || err != io.EOF || string(buf[:4]) != "0123" {
		t.Fatalf("read across the end: n=%d err=%v %q", n, err, buf[:n])
	}
	if err := f.Truncate(size / 2); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("truncate: %v, want EINVAL", err)
	}
	before := dev.flushes.Load()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if dev.flushes.Load() == before {
		t.Fatal("fsync on the file did not flush the device")
	}
	dev.failWrites.Store(true)
	if _, err := f.WriteAt([]byte("x"), 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write on a failing device: %v, want EIO", err)
	}
}

// TestCloseIsIdempotent: Close detaches and unmounts once; later calls are no-ops.
func TestCloseIsIdempotent(t *testing.T) {
	requireMount(t)
	e := export(t, NewMemoryDevice(4<<20), Options{})
	loop := filepath.Base(e.Device())
	for i := range 3 {
		if err := e.Close(); err != nil {
			t.Fatalf("close #%d: %v", i+1, err)
		}
	}
	select {
	case <-e.Done():
	default:
		t.Fatal("Done not closed after Close")
	}
	if isMountPoint(t, filepath.Dir(e.File())) {
		t.Fatal("FUSE file system still mounted after Close")
	}
	if bf, ok := loopBackingFile(loop); ok && bf == e.File() {
		t.Fatalf("%s still bound to %s after Close", e.Device(), bf)
	}
}

// TestCloseWhileOpen: a loop device still open at the deadline makes Close detach lazily,
// report ErrBusy, and keep serving until the holder lets go.
func TestCloseWhileOpen(t *testing.T) {
	requireMount(t)
	dev := NewMemoryDevice(4 << 20)
	e, err := Export(context.Background(), dev, filepath.Join(t.TempDir(), "export"),
		Options{CloseTimeout: 300 * time.Millisecond, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	holder, err := os.OpenFile(e.Device(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()

	if err := e.Close(); !errors.Is(err, ErrBusy) {
		t.Fatalf("close with the loop device open: %v, want ErrBusy", err)
	}
	if err := e.Close(); !errors.Is(err, ErrBusy) {
		t.Fatalf("second close: %v, want the first result", err)
	}
	if isMountPoint(t, filepath.Dir(e.File())) {
		t.Fatal("export dir still a mount point after a lazy close")
	}
	// Still served: I/O through the open loop device works.
	if _, err := holder.WriteAt([]byte("still here"), 0); err != nil {
		t.Fatalf("write while lazily closed: %v", err)
	}
	if err := holder.Sync(); err != nil {
		t.Fatalf("sync while lazily closed: %v", err)
	}
	got := make([]byte, 10)
	if _, err := dev.ReadAt(got, 0); err != nil || string(got) != "still here" {
		t.Fatal("write while lazily closed did not reach the device")
	}
	holder.Close()
	select {
	case <-e.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("FUSE server still serving 10s after the last holder closed the loop device")
	}
	wait.Eventually(t, 10*time.Second, "the loop device to be released", loopReleased(e.Device(), e.File()))
}

const helperEnv = "CRDIPC_BLOCKDEV_HELPER_DIR"

// TestMain runs the test binary as the helper process of TestCleanupStaleExport when
// helperEnv names a directory (it exports there and serves until it is killed), and of
// TestAdoptAfterKill when takeoverEnv is set.
func TestMain(m *testing.M) {
	if dir := os.Getenv(helperEnv); dir != "" {
		exportUntilKilled(dir)
	}
	if spec := os.Getenv(takeoverEnv); spec != "" {
		takeoverHelper(spec)
	}
	// The tests are clients of the FUSE servers they run, in the same process (in production
	// the client is the kernel's loop device, for the node plugin's process). Once, under
	// -race (CI, 2026-12-03, TestFileBounds), that deadlocked for 32 minutes: a test thread
	// blocked in the kernel on a FUSE request held its P while a collection's mark
	// termination waited for every P, and the server's goroutines, woken by the request,
	// waited for the collection. Not root-caused (which call held the P is unknown); no
	// collections while the tests run (3.5 GB at most under -race, measured).
	debug.SetGCPercent(-1)
	os.Exit(m.Run())
}

func exportUntilKilled(dir string) {
	e, err := Export(context.Background(), NewMemoryDevice(4<<20), dir, Options{Logger: quietLogger()})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	fmt.Println("DEVICE", e.Device())
	select {} // served until killed
}

// TestCleanupStaleExport: a process exports and dies by SIGKILL, leaving a dead FUSE mount
// with a loop device bound to it; Cleanup removes both and the dir can be exported again.
// With a file system still mounted on the loop device (the CSI driver's restart case), the
// loop device goes once that is unmounted, which must not hang.
func TestCleanupStaleExport(t *testing.T) {
	requireMount(t, "dd", "mkfs.ext4", "mount")
	t.Run("idle", func(t *testing.T) { testCleanupStaleExport(t, false) })
	t.Run("fs-mounted", func(t *testing.T) { testCleanupStaleExport(t, true) })
}

func testCleanupStaleExport(t *testing.T, withFS bool) {
	dir := filepath.Join(t.TempDir(), "export")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+dir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		_ = Cleanup(dir)
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if l := sc.Text(); strings.HasPrefix(l, "DEVICE ") || strings.HasPrefix(l, "ERROR ") {
				lines <- l
				break
			}
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var loopDev string
	select {
	case l := <-lines:
		var ok bool
		if loopDev, ok = strings.CutPrefix(l, "DEVICE "); !ok {
			t.Fatalf("helper process: %q", l)
		}
	case <-time.After(time.Minute):
		t.Fatal("helper process did not export within a minute")
	}
	var fsDir string
	if withFS {
		command(t, "mkfs.ext4", "-q", "-F", loopDev)
		fsDir = mountFS(t, loopDev)
		if err := os.WriteFile(filepath.Join(fsDir, "f"), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true

	file := filepath.Join(dir, VolumeName)
	if !isMountPoint(t, dir) {
		t.Fatal("no stale mount left by the killed process")
	}
	if bf, ok := loopBackingFile(filepath.Base(loopDev)); !ok || bf != file {
		t.Fatalf("%s not bound to %s after the kill (bound: %v, to %q)", loopDev, file, ok, bf)
	}
	// The loop driver names the dead mount's device number: what Cleanup matches on when
	// paths do not line up.
	if ms, err := mountsAt(dir); err != nil || len(ms) != 1 || loopFSDev(filepath.Base(loopDev)) != ms[0].dev {
		t.Fatalf("loop device's file system %d, mounts at dir %+v (%v)", loopFSDev(filepath.Base(loopDev)), ms, err)
	}
	// I/O on the orphaned loop device fails instead of hanging.
	if out, err := exec.Command("dd", "if="+loopDev, "of=/dev/null", "bs=4K", "count=1", "iflag=direct").CombinedOutput(); err == nil {
		t.Fatalf("read from an orphaned loop device succeeded:\n%s", out)
	}
	if _, err := Export(context.Background(), NewMemoryDevice(4<<20), dir, Options{Logger: quietLogger()}); err == nil {
		t.Fatal("Export over a stale export succeeded")
	}

	if err := Cleanup(dir); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	if isMountPoint(t, dir) {
		t.Fatal("stale mount still there after Cleanup")
	}
	if withFS {
		// The file system sees a dead disk: unmounting it works (with errors logged by
		// the kernel), and releases the loop device that Cleanup marked auto-clear.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(ctx, "umount", fsDir).CombinedOutput(); err != nil {
			t.Fatalf("umount the file system on the orphaned loop device: %v\n%s", err, out)
		}
	}
	wait.Eventually(t, 10*time.Second, "the orphaned loop device to be released", loopReleased(loopDev, file))
	if err := Cleanup(dir); err != nil {
		t.Fatalf("cleanup with nothing to clean: %v", err)
	}
	export2, err := Export(context.Background(), NewMemoryDevice(4<<20), dir, Options{Logger: quietLogger()})
	if err != nil {
		t.Fatalf("export after cleanup: %v", err)
	}
	if err := export2.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestAvailable is informative on hosts that can export and checks the error's shape on
// hosts that cannot.
func TestAvailable(t *testing.T) {
	err := Available()
	if err == nil {
		return
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Available error does not wrap ErrUnavailable: %v", err)
	}
	t.Logf("unavailable: %v", err)
}
