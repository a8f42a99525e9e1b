package blockdev

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/testenv/require"
)

// growingDevice is a fileDevice whose size grows, as the volume engine's does on Grow.
type growingDevice struct {
	*fileDevice
	size atomic.Int64
}

func newGrowingDevice(t *testing.T, path string, size int64) *growingDevice {
	d := &growingDevice{fileDevice: newFileDevice(t, path, size)}
	d.size.Store(size)
	return d
}

func (d *growingDevice) Size() int64 { return d.size.Load() }

func (d *growingDevice) grow(t *testing.T, size int64) {
	t.Helper()
	if err := d.f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	d.size.Store(size)
}

// loopBytes is the loop device's size as `blockdev --getsize64` reports it (BLKGETSIZE64).
func loopBytes(t *testing.T, dev string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.TrimSpace(command(t, "blockdev", "--getsize64", dev)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestResizeGrowsTheLoopDevice(t *testing.T) {
	requireMount(t, "dd", "blockdev")
	const oldSize, newSize = 16 << 20, 40 << 20
	backing := filepath.Join(t.TempDir(), "backing.img")
	dev := newGrowingDevice(t, backing, oldSize)
	e := export(t, dev, Options{})

	before := bytes.Repeat([]byte("before!\n"), 64<<10/8)
	src := filepath.Join(t.TempDir(), "before")
	if err := os.WriteFile(src, before, 0o600); err != nil {
		t.Fatal(err)
	}
	command(t, "dd", "if="+src, "of="+e.Device(), "bs=64K", "seek=255", "oflag=direct", "status=none") // the last 64 KiB

	if err := e.Resize(newSize); err == nil || !strings.Contains(err.Error(), "grow it first") {
		t.Fatalf("Resize past the device's size: %v", err)
	}
	if err := e.Resize(oldSize / 2); err == nil || !strings.Contains(err.Error(), "shrinking") {
		t.Fatalf("Resize to a smaller size: %v", err)
	}
	if err := e.Resize(oldSize + 100); err == nil {
		t.Fatal("Resize to a size that is not whole sectors succeeded")
	}
	if got := loopBytes(t, e.Device()); got != oldSize {
		t.Fatalf("loop device is %d bytes after refused resizes, want %d", got, oldSize)
	}

	dev.grow(t, newSize)
	for range 2 { // idempotent
		if err := e.Resize(newSize); err != nil {
			t.Fatal(err)
		}
	}
	if got := loopBytes(t, e.Device()); got != newSize {
		t.Fatalf("blockdev --getsize64 %s = %d after Resize, want %d", e.Device(), got, newSize)
	}
	if fi, err := os.Stat(e.File()); err != nil || fi.Size() != newSize {
		t.Fatalf("FUSE file after Resize: %v, %v; want %d bytes", fi, err, newSize)
	}

	// What was written before is intact, through the loop device and in the Device.
	if out := command(t, "dd", "if="+e.Device(), "bs=64K", "skip=255", "count=1", "iflag=direct", "status=none"); out != string(before) {
		t.Fatal("data written before the resize reads back differently")
	}
	if !fileContains(t, backing, oldSize-64<<10, before) {
		t.Fatal("data written before the resize is not in the device")
	}
	// Writes past the old end land in the Device.
	after := bytes.Repeat([]byte("grown!!\n"), 64<<10/8)
	src2 := filepath.Join(t.TempDir(), "after")
	if err := os.WriteFile(src2, after, 0o600); err != nil {
		t.Fatal(err)
	}
	command(t, "dd", "if="+src2, "of="+e.Device(), "bs=64K", "seek=639", "oflag=direct", "status=none") // the new last 64 KiB
	if !fileContains(t, backing, newSize-64<<10, after) {
		t.Fatal("a write past the old end did not reach the device")
	}
}

// requireCap skips a test that needs a capability this process lacks (from its effective
// set), unless env is "1", where the lack is a failure. It is its own variable, not
// CRDIPC_REQUIRE_MOUNT: a container may mount and use loop devices without it.
func requireCap(t *testing.T, bit int, name, env string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if hex, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			if caps&(1<<bit) != 0 {
				return
			}
		}
	}
	require.Capable(t, env, fmt.Errorf("this process lacks %s", name))
}

// The whole expansion with ext4 on the loop device: the Device grows, Resize, resize2fs,
// and the file system shows the new size, holds its data and takes more. Online (mounted,
// as the CSI node expansion does it) needs CAP_SYS_RESOURCE for the kernel's resize ioctl;
// offline (unmounted) needs only what mounting needs.
func TestResizeExt4(t *testing.T) {
	requireMount(t, "mkfs.ext4", "mount", "resize2fs", "e2fsck", "sync")
	t.Run("online", func(t *testing.T) {
		requireCap(t, unix.CAP_SYS_RESOURCE, "CAP_SYS_RESOURCE (ext4 online resize)", "CRDIPC_REQUIRE_ONLINE_RESIZE")
		testResizeExt4(t, true)
	})
	t.Run("offline", func(t *testing.T) { testResizeExt4(t, false) })
}

func testResizeExt4(t *testing.T, online bool) {
	const oldSize, newSize = 64 << 20, 160 << 20
	dev := newGrowingDevice(t, filepath.Join(t.TempDir(), "backing.img"), oldSize)
	e := export(t, dev, Options{})
	command(t, "mkfs.ext4", "-q", "-F", e.Device())
	mnt := mountFS(t, e.Device())

	data := make([]byte, 8<<20)
	_, _ = rand.NewChaCha8([32]byte{7}).Read(data)
	if err := os.WriteFile(filepath.Join(mnt, "data"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	command(t, "sync")
	fsBytes := func() int64 {
		var st unix.Statfs_t
		if err := unix.Statfs(mnt, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Blocks) * st.Bsize
	}
	oldFS := fsBytes()

	dev.grow(t, newSize)
	if err := e.Resize(newSize); err != nil {
		t.Fatal(err)
	}
	if online {
		command(t, "resize2fs", e.Device())
	} else {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Fatal(err)
		}
		command(t, "e2fsck", "-fy", e.Device()) // resize2fs insists on a fresh check
		command(t, "resize2fs", e.Device())
		command(t, "mount", e.Device(), mnt)
	}
	if got := fsBytes(); got <= oldSize || got <= oldFS {
		t.Fatalf("file system is %d bytes after resize2fs (was %d; device %d -> %d)", got, oldFS, oldSize, newSize)
	}
	// The grown file system takes data beyond the old device's end.
	big := make([]byte, 96<<20)
	_, _ = rand.NewChaCha8([32]byte{8}).Read(big)
	if err := os.WriteFile(filepath.Join(mnt, "big"), big, 0o600); err != nil {
		t.Fatalf("writing 96 MiB to the grown file system: %v", err)
	}
	command(t, "sync")
	for name, want := range map[string][]byte{"data": data, "big": big} {
		got, err := os.ReadFile(filepath.Join(mnt, name))
		if err != nil || sha256.Sum256(got) != sha256.Sum256(want) {
			t.Fatalf("%s after the growth: %v (%d bytes)", name, err, len(got))
		}
	}
}
