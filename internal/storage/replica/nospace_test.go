package replica

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/testenv/require"
)

// smallFS mounts a tmpfs of size bytes on dir for the test: a file system that fills. It
// needs mount privilege: skipped without it, failed when CRDIPC_REQUIRE_MOUNT=1 (as in CI).
func smallFS(t *testing.T, dir string, size string) {
	t.Helper()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NODEV|unix.MS_NOSUID, "size="+size); err != nil {
		require.Capable(t, "CRDIPC_REQUIRE_MOUNT", fmt.Errorf("mounting a tmpfs: %w", err))
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmounting %s: %v", dir, err)
		}
	})
}

// A replica on a full file system refuses the write with ErrNoSpace (across the wire),
// says so in Info until a write succeeds again, and keeps every write it acknowledged.
func TestWriteOnAFullFileSystem(t *testing.T) {
	const chunk = 256 << 10
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	smallFS(t, n.dir, "2m")
	n.create("ns/r1", 8<<20) // sparse: promises more than the file system holds
	// Something else on the disk takes most of it.
	filler := filepath.Join(n.dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	n.start()
	ctx := ctxT(t)
	r := n.dial(t).Replica("ns/r1")
	if _, err := r.Open(ctx); err != nil {
		t.Fatal(err)
	}

	var written [][]byte
	var err error
	for i := 0; i < 32; i++ {
		p := make([]byte, chunk)
		pattern(p, uint64(i+1))
		if err = r.WriteAt(ctx, p, int64(i)*chunk, uint64(i+1)); err != nil {
			break
		}
		written = append(written, p)
	}
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("writing past the file system's size: %v, want ErrNoSpace", err)
	}
	if !strings.Contains(err.Error(), "ENOSPC") {
		t.Errorf("error %q does not name ENOSPC", err)
	}
	if len(written) == 0 {
		t.Fatal("not even the first write fitted: the test's sizes are off")
	}
	in, ierr := r.Info(ctx)
	if ierr != nil {
		t.Fatal(ierr)
	}
	if !strings.Contains(in.NoSpace, "ENOSPC") {
		t.Errorf("Info.NoSpace = %q, want the failure", in.NoSpace)
	}
	if in.Revision != uint64(len(written)) {
		t.Errorf("revision %d after %d applied writes: the failed write counted", in.Revision, len(written))
	}
	// A flush on the full file system may fail too; what was acknowledged reads back.
	for i, want := range written {
		got := make([]byte, chunk)
		if err := r.ReadAt(ctx, got, int64(i)*chunk); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("chunk %d changed after the disk filled", i)
		}
	}

	// Space comes back: the next write succeeds and the report clears.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, chunk)
	pattern(p, 99)
	if err := r.WriteAt(ctx, p, int64(len(written))*chunk, uint64(len(written)+1)); err != nil {
		t.Fatalf("write after space was freed: %v", err)
	}
	if in, err := r.Info(ctx); err != nil || in.NoSpace != "" {
		t.Errorf("after a good write: NoSpace %q, %v; want it cleared", in.NoSpace, err)
	}
	if err := r.CloseSession(ctx); err != nil {
		t.Fatal(err)
	}
}
