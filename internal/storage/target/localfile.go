package target

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// directMin is the smallest read that bypasses the page cache: a sequential read arrives
// in requests of up to a megabyte; a small one is more likely to find its pages cached
// (a read-modify-write's sector, a file system's metadata).
const directMin = 64 << 10

// replicaFile is the local replica's data file as the target reads it: through the
// read-only descriptor its server handed out, and, for a large aligned read, through a
// second descriptor of the same file opened O_DIRECT.
//
// Why direct: a volume's reads are cached above it (the page cache of the file system on
// the volume), so caching them again in the replica's pages holds them twice, and a
// buffered read from the disk is bounded by read-ahead's pace and the copy: on this
// machine's disk 0.8–1.2 GB/s at 16 in flight against 2.2–4.8 GB/s direct
// (docs/performance.md). Pages that are all cached already (written a moment ago, read
// by someone else) are copied, not read again. Why it is still coherent: before a direct
// read the kernel writes back and waits for the dirty pages of its range
// (filemap_write_and_wait_range), so a read issued after an acknowledged write, whose
// pwrite left it in the page cache, reads it from the disk.
type replicaFile struct {
	f *os.File
	// direct is nil where the file system has no direct I/O (tmpfs, some FUSE ones).
	direct *os.File
	// offAlign and memAlign: what a direct read's offset and length, and its buffer's
	// address, must be multiples of (statx's STATX_DIOALIGN).
	offAlign, memAlign int64
}

// newReplicaFile wraps f, which the caller no longer closes.
func newReplicaFile(f *os.File) *replicaFile {
	r := &replicaFile{f: f}
	// A new open file description of the same file: O_DIRECT set on f itself would be
	// shared with the server that sent it.
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return r
	}
	var st unix.Statx_t
	if unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &st) != nil ||
		st.Mask&unix.STATX_DIOALIGN == 0 || st.Dio_offset_align == 0 || st.Dio_mem_align == 0 {
		unix.Close(fd)
		return r
	}
	r.direct = os.NewFile(uintptr(fd), f.Name())
	r.offAlign, r.memAlign = int64(st.Dio_offset_align), int64(st.Dio_mem_align)
	return r
}

// canDirect says whether p at off may be read with the direct descriptor.
func (r *replicaFile) canDirect(p []byte, off int64) bool {
	return r.direct != nil && len(p) >= directMin &&
		off%r.offAlign == 0 && int64(len(p))%r.offAlign == 0 &&
		int64(uintptr(unsafe.Pointer(unsafe.SliceData(p))))%r.memAlign == 0
}

// cached says whether every page of p's range at off is in the page cache, where a
// buffered read is a copy from memory (tens of GB/s) and a direct one would go to the
// disk. A kernel without cachestat (before 6.5) says no.
func (r *replicaFile) cached(p []byte, off int64) bool {
	page := int64(os.Getpagesize())
	first, end := off/page*page, (off+int64(len(p))+page-1)/page*page
	var st unix.Cachestat_t
	rng := unix.CachestatRange{Off: uint64(first), Len: uint64(end - first)}
	if unix.Cachestat(uint(r.f.Fd()), &rng, &st, 0) != nil {
		return false
	}
	return int64(st.Cache) >= (end-first)/page
}

// via is the descriptor that reads p at off.
func (r *replicaFile) via(p []byte, off int64) *os.File {
	if r.canDirect(p, off) && !r.cached(p, off) {
		return r.direct
	}
	return r.f
}

// ReadAt fills p from the file; past its end is a hole, read as zeros as the replica
// server reads it. A large aligned read of pages not all cached is direct.
func (r *replicaFile) ReadAt(p []byte, off int64) error {
	f := r.via(p, off)
	n, err := f.ReadAt(p, off)
	if errors.Is(err, io.EOF) {
		clear(p[n:])
		err = nil
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", f.Name(), err)
	}
	return nil
}

func (r *replicaFile) Close() error {
	if r.direct != nil {
		r.direct.Close()
	}
	return r.f.Close()
}
