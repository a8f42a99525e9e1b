package target

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/testenv/require"
)

// alignedBuf is n bytes whose address is a multiple of align.
func alignedBuf(n, align int) []byte {
	b := make([]byte, n+align)
	skip := (align - int(uintptr(unsafe.Pointer(&b[0])))%align) % align
	return b[skip : skip+n]
}

// A large aligned read of pages not all cached goes around the page cache and still reads
// what a buffered writer left there a moment before (not written back, not synced), as
// the replica server leaves an acknowledged write. Cached pages, small or unaligned reads,
// and a file system without direct I/O are read buffered.
func TestReplicaFileReadsWhatWasJustWritten(t *testing.T) {
	const size = 4 << 20
	path := filepath.Join(t.TempDir(), "data")
	w, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	want := make([]byte, size)
	rand.Read(want)
	if _, err := w.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	ro, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	rf := newReplicaFile(ro)
	defer rf.Close()
	if rf.direct == nil {
		require.Capable(t, "CRDIPC_REQUIRE_DIRECT_IO", fmt.Errorf("no direct I/O on the file system of %s", path))
	}
	// evict writes the file back and drops its pages, so that only what is written after
	// is cached.
	evict := func() {
		t.Helper()
		if err := w.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fadvise(int(w.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			t.Fatal(err)
		}
	}

	for round := range 8 {
		evict()
		// New bytes in the middle of the range, only in the page cache, as a pwrite leaves
		// them; the rest of the range is on the disk only.
		off := int64(round%4) << 20
		fresh := make([]byte, 256<<10)
		rand.Read(fresh)
		if _, err := w.WriteAt(fresh, off+384<<10); err != nil {
			t.Fatal(err)
		}
		copy(want[off+384<<10:], fresh)
		p := alignedBuf(1<<20, 4096)
		if rf.via(p, off) != rf.direct {
			t.Fatalf("a 1 MiB read at %d, a quarter of it cached, is not direct (alignment %d, memory %d)", off, rf.offAlign, rf.memAlign)
		}
		if err := rf.ReadAt(p, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(p, want[off:off+1<<20]) {
			t.Fatalf("round %d: the direct read at %d does not see the write before it", round, off)
		}
	}

	// All cached: copied from memory.
	if _, err := w.ReadAt(make([]byte, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	if p := alignedBuf(1<<20, 4096); rf.via(p, 0) != rf.f {
		t.Error("a read of cached pages is direct")
	}

	// Unaligned in memory, offset or length, or small: buffered, and right too.
	evict()
	for _, tc := range []struct {
		name string
		buf  []byte
		off  int64
	}{
		{"small", alignedBuf(4096, 4096), 8192},
		{"odd offset", alignedBuf(directMin, 4096), 7},
		{"odd length", alignedBuf(directMin+1, 4096), 0},
		{"odd memory", alignedBuf(directMin+1, 4096)[1:], 0},
	} {
		if rf.via(tc.buf, tc.off) != rf.f {
			t.Errorf("%s: read would be direct", tc.name)
		}
		if err := rf.ReadAt(tc.buf, tc.off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(tc.buf, want[tc.off:tc.off+int64(len(tc.buf))]) {
			t.Errorf("%s: read differs from the file", tc.name)
		}
	}

	// Past the end is a hole, read as zeros.
	evict()
	p := alignedBuf(1<<20, 4096)
	for i := range p {
		p[i] = 0xff
	}
	if rf.via(p, size-512<<10) != rf.direct {
		t.Error("a read across the file's end is not direct")
	}
	if err := rf.ReadAt(p, size-512<<10); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(p[:512<<10], want[size-512<<10:]) || !bytes.Equal(p[512<<10:], make([]byte, 512<<10)) {
		t.Error("a read across the file's end: not its bytes then zeros")
	}
}
