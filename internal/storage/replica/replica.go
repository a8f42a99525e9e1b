package replica

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/crdipc/crdipc/internal/safefile"
	"golang.org/x/sys/unix"
)

// Location says where a replica's files are, as the node agent's Lookup reports them.
type Location struct {
	// Data is the sparse replica file.
	Data string
	// Meta is the metadata file; empty means Data + ".meta".
	Meta string
	// Size is the replica size; 0 means the data file's size.
	Size int64
}

// Info is the state of a replica as the server reports it.
type Info struct {
	ID   string `json:"id"`
	Size int64  `json:"size"`
	// Revision is the highest revision applied. The durable one is persisted by Flush and
	// CloseSession; after a restart Revision is the durable one.
	Revision uint64 `json:"revision"`
	// Dirty: opened for writing and not closed cleanly since (durable).
	Dirty bool `json:"dirty"`
	// Rebuilding: contents incomplete, never a source (durable).
	Rebuilding bool `json:"rebuilding"`
	// RebuildSource is where the current (or failed) rebuild copies from, as
	// "<addr>/<replica id>" (split at the first "/"), while Rebuilding. It is durable: the
	// source named when Rebuilding was last set, also after a restart.
	RebuildSource string `json:"rebuildSource,omitempty"`
	// RebuildDone and RebuildTotal are bytes of the source's allocated data copied and to
	// copy by the current or last rebuild since the server started.
	RebuildDone  int64 `json:"rebuildDone"`
	RebuildTotal int64 `json:"rebuildTotal"`
	// RebuildError is the failure of the last rebuild while Rebuilding is still true.
	RebuildError string `json:"rebuildError,omitempty"`
	// Allocated is the space the data file occupies (st_blocks).
	Allocated int64 `json:"allocated"`
	// Epoch counts writer sessions opened on the replica (durable).
	Epoch uint64 `json:"epoch"`
	// Session: a writer session is open now, so Dirty means "being written" rather than
	// "its writer went away without closing".
	Session bool `json:"session"`
	// NoSpace is the last write, copy or flush that failed because the file system is full
	// (ErrNoSpace), while none has succeeded since; empty otherwise. Not durable: a full
	// file system shows again at the next write.
	NoSpace string `json:"noSpace,omitempty"`
}

// Extent is an allocated range of a replica file.
type Extent struct{ Offset, Length int64 }

// meta is the durable metadata file (JSON).
type meta struct {
	Revision   uint64 `json:"revision"`
	Dirty      bool   `json:"dirty"`
	Rebuilding bool   `json:"rebuilding"`
	Epoch      uint64 `json:"epoch"`
	// RebuildSource is the source of the rebuild that set Rebuilding ("<addr>/<id>").
	RebuildSource string `json:"rebuildSource,omitempty"`
}

// replica is an open replica of this node. Server.mu guards refs; the fields below say
// what guards them.
type replica struct {
	id       string
	dataPath string
	metaPath string
	f        *os.File
	refs     int
	// snap: a snapshot, served read-only under "<replica id>@<name>".
	snap bool
	// detached: replaced in Server.replicas by a newer open of the same id (a snapshot
	// deleted and taken again); closed when its last user releases it. Under Server.mu.
	detached bool

	// size is the replica's size; it only grows (Server.Resize), while I/O goes on.
	size atomic.Int64

	// rev is the highest revision applied, durable or not.
	rev atomic.Uint64
	// owner is the connection holding the writer session, nil if none.
	owner atomic.Pointer[serverConn]

	// metaMu serializes metadata writes and guards m, the durable metadata.
	metaMu sync.Mutex
	m      meta

	// applyMu orders writer-session writes against the rebuild copier: writes hold it
	// shared (they may run concurrently), the copier holds it exclusively while it checks
	// the fresh set and applies a chunk, so a copied chunk never lands on a newer write.
	applyMu sync.RWMutex
	// fresh (set and cleared under applyMu held exclusively) is non-nil while a rebuild
	// copier runs; freshMu guards its contents, since writers mark it concurrently.
	fresh   *sectorSet
	freshMu sync.Mutex

	// wb starts writeback of what writes and copies leave in the page cache.
	wb *writeback
}

func openReplica(id string, loc Location) (*replica, error) {
	f, err := safefile.OpenFile(loc.Data, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("replica file %s: %w", loc.Data, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("opening replica file: %w", err)
	}
	r := &replica{id: id, dataPath: loc.Data, metaPath: loc.Meta, f: f}
	if r.metaPath == "" {
		r.metaPath = loc.Data + ".meta"
	}
	size := loc.Size
	if size <= 0 {
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("stat replica file: %w", err)
		}
		size = st.Size()
	}
	r.size.Store(size)
	m, err := readMeta(r.metaPath)
	if err != nil {
		f.Close()
		return nil, err
	}
	r.m = m
	r.rev.Store(m.Revision)
	r.wb = newWriteback(r)
	return r, nil
}

func (r *replica) close() error {
	r.wb.stop()
	return r.f.Close()
}

// readMeta returns the zero metadata for a replica that never had any: a new, empty replica
// at revision 0, which never wins source selection against one that was written.
func readMeta(path string) (meta, error) {
	var m meta
	data, err := safefile.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return m, fmt.Errorf("reading replica metadata: %w", err)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("parsing replica metadata %s: %w", path, err)
	}
	return m, nil
}

// writeMeta replaces path atomically and durably: a crash leaves the old or the new
// content, never a torn file, and the rename itself survives (directory fsync).
func writeMeta(path string, m meta) error {
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if err := safefile.Write(path, data, 0o600); err != nil {
		return fmt.Errorf("writing replica metadata: %w", noSpace(err))
	}
	return nil
}

// persist applies change to the durable metadata and writes it. On failure the in-memory
// copy keeps the last durable state.
func (r *replica) persist(change func(*meta)) (meta, error) {
	r.metaMu.Lock()
	defer r.metaMu.Unlock()
	m := r.m
	change(&m)
	if err := writeMeta(r.metaPath, m); err != nil {
		return r.m, err
	}
	r.m = m
	return m, nil
}

func (r *replica) durable() meta {
	r.metaMu.Lock()
	defer r.metaMu.Unlock()
	return r.m
}

// bumpRevision raises rev to at least v.
func (r *replica) bumpRevision(v uint64) {
	for {
		cur := r.rev.Load()
		if v <= cur || r.rev.CompareAndSwap(cur, v) {
			return
		}
	}
}

func (r *replica) checkRange(off, n int64) error {
	if size := r.size.Load(); off < 0 || n < 0 || off > size || n > size-off {
		return fmt.Errorf("range [%d, +%d) outside replica %s of size %d: %w", off, n, r.id, size, ErrInvalid)
	}
	return nil
}

// grow raises the replica's size to size, which the data file must already hold (the
// node's backend grows it first). It never shrinks. Called under Server.mu.
func (r *replica) grow(size int64) error {
	cur := r.size.Load()
	if size < cur {
		return fmt.Errorf("replica %s is %d bytes; shrinking it to %d is not supported: %w", r.id, cur, size, ErrInvalid)
	}
	if size == cur {
		return nil
	}
	st, err := r.f.Stat()
	if err != nil {
		return fmt.Errorf("stat replica %s: %w", r.id, err)
	}
	if st.Mode().IsRegular() && st.Size() < size {
		return fmt.Errorf("replica file of %s holds %d bytes, fewer than %d: grow the file first: %w", r.id, st.Size(), size, ErrInvalid)
	}
	r.size.Store(size)
	return nil
}

// writeAt applies a writer-session write. Writes must be sector aligned because a rebuild
// tracks fresh data per sector: a partial sector marked fresh would keep stale bytes.
func (r *replica) writeAt(p []byte, off int64, rev uint64) error {
	if off%SectorSize != 0 || len(p)%SectorSize != 0 {
		return fmt.Errorf("write [%d, +%d) not aligned to %d bytes: %w", off, len(p), SectorSize, ErrInvalid)
	}
	if err := r.checkRange(off, int64(len(p))); err != nil {
		return err
	}
	r.applyMu.RLock()
	return r.writeLocked(p, off, rev)
}

// tryWriteAt is writeAt unless a snapshot or the rebuild copier holds the replica's writes
// back: then it does nothing and returns errWouldWait, and the caller writes from a
// goroutine of its own, so that its other requests (reads go on under a snapshot) are not
// held back behind this one.
func (r *replica) tryWriteAt(p []byte, off int64, rev uint64) error {
	if off%SectorSize != 0 || len(p)%SectorSize != 0 {
		return fmt.Errorf("write [%d, +%d) not aligned to %d bytes: %w", off, len(p), SectorSize, ErrInvalid)
	}
	if err := r.checkRange(off, int64(len(p))); err != nil {
		return err
	}
	if !r.applyMu.TryRLock() {
		return errWouldWait
	}
	return r.writeLocked(p, off, rev)
}

// errWouldWait: tryWriteAt would have had to wait for applyMu.
var errWouldWait = errors.New("write would wait")

// writeLocked applies a write under applyMu held for reading, which it releases.
func (r *replica) writeLocked(p []byte, off int64, rev uint64) error {
	if fs := r.fresh; fs != nil {
		r.freshMu.Lock()
		fs.mark(off, int64(len(p)))
		r.freshMu.Unlock()
	}
	_, err := r.f.WriteAt(p, off)
	if err == nil {
		// Still under applyMu, so a snapshot's revision covers every write it holds.
		r.bumpRevision(rev)
		r.wb.wrote(len(p))
	}
	r.applyMu.RUnlock()
	if err != nil {
		return fmt.Errorf("writing replica %s: %w", r.id, noSpace(err))
	}
	return nil
}

// readAt fills p; bytes past the end of a short file read as zeros, like holes.
func (r *replica) readAt(p []byte, off int64) error {
	if err := r.checkRange(off, int64(len(p))); err != nil {
		return err
	}
	n, err := r.f.ReadAt(p, off)
	if err == io.EOF {
		clear(p[n:])
		err = nil
	}
	if err != nil {
		return fmt.Errorf("reading replica %s: %w", r.id, err)
	}
	return nil
}

// withFd runs fn on the file descriptor without racing a concurrent close.
func (r *replica) withFd(fn func(fd int) error) error {
	rc, err := r.f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

func (r *replica) datasync() error {
	err := r.withFd(func(fd int) error {
		for {
			err := unix.Fdatasync(fd)
			if err != unix.EINTR {
				return err
			}
		}
	})
	if err != nil {
		return fmt.Errorf("fdatasync replica %s: %w", r.id, noSpace(err))
	}
	return nil
}

// flush makes every write applied so far durable, then records their revision. The
// revision is read before the fdatasync so it never covers a write the sync missed.
func (r *replica) flush(change func(*meta)) error {
	rev := r.rev.Load()
	if err := r.datasync(); err != nil {
		return err
	}
	_, err := r.persist(func(m *meta) {
		m.Revision = max(m.Revision, rev)
		if change != nil {
			change(m)
		}
	})
	return err
}

// extents lists allocated ranges in [off, end), at most limit of them; more says the list
// was cut short.
func (r *replica) extents(off, end int64, limit int) (exts []Extent, more bool, err error) {
	end = min(end, r.size.Load())
	err = r.withFd(func(fd int) error {
		for off < end {
			d, err := unix.Seek(fd, off, unix.SEEK_DATA)
			if err == unix.ENXIO {
				return nil // no data past off
			}
			if err != nil {
				return fmt.Errorf("seek data: %w", err)
			}
			if d >= end {
				return nil
			}
			h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
			if err != nil {
				return fmt.Errorf("seek hole: %w", err)
			}
			h = min(h, end)
			if len(exts) == limit {
				more = true
				return nil
			}
			exts = append(exts, Extent{Offset: d, Length: h - d})
			off = h
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("listing extents of replica %s: %w", r.id, err)
	}
	return exts, more, nil
}

// deleted reports whether the data file was removed (its metadata must not be recreated).
func (r *replica) deleted() bool {
	st, err := r.f.Stat()
	if err != nil {
		return true
	}
	s, ok := st.Sys().(*syscall.Stat_t)
	return ok && s.Nlink == 0
}

func (r *replica) allocated() int64 {
	st, err := r.f.Stat()
	if err != nil {
		return 0
	}
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return s.Blocks * 512
	}
	return 0
}

// punchAll deallocates the whole file, keeping its size. It falls back to truncating to
// zero and back, which has the same effect on file systems without hole punching.
func (r *replica) punchAll() error {
	st, err := r.f.Stat()
	if err != nil {
		return fmt.Errorf("stat replica %s: %w", r.id, err)
	}
	fsize := st.Size()
	if fsize == 0 {
		return nil
	}
	err = r.withFd(func(fd int) error {
		return unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, fsize)
	})
	if errors.Is(err, unix.EOPNOTSUPP) {
		if err = r.f.Truncate(0); err == nil {
			err = r.f.Truncate(fsize)
		}
	}
	if err != nil {
		return fmt.Errorf("punching replica %s: %w", r.id, err)
	}
	return nil
}

// applyCopy writes a chunk copied from the rebuild source, except the sectors the writer
// session wrote since the rebuild began: those hold newer data than the copy.
func (r *replica) applyCopy(p []byte, off int64) error {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	var werr error
	r.fresh.eachStale(off, int64(len(p)), func(o, n int64) bool {
		if _, err := r.f.WriteAt(p[o-off:o-off+n], o); err != nil {
			werr = fmt.Errorf("writing replica %s: %w", r.id, noSpace(err))
			return false
		}
		r.wb.wrote(int(n))
		return true
	})
	return werr
}

// pageSectors is the number of sectors per page of a sectorSet (4 MiB of data), so a
// rebuild of a large, sparsely written replica keeps a small set.
const pageSectors = 8192

// sectorSet is a set of sectors, as bitmap pages allocated on first use.
type sectorSet struct {
	pages map[int64]*[pageSectors / 64]uint64
}

func newSectorSet() *sectorSet {
	return &sectorSet{pages: map[int64]*[pageSectors / 64]uint64{}}
}

// mark adds the sectors that [off, off+n) touches.
func (s *sectorSet) mark(off, n int64) {
	if n <= 0 {
		return
	}
	for sec, last := off/SectorSize, (off+n-1)/SectorSize; sec <= last; sec++ {
		pi := sec / pageSectors
		pg := s.pages[pi]
		if pg == nil {
			pg = new([pageSectors / 64]uint64)
			s.pages[pi] = pg
		}
		bit := sec % pageSectors
		pg[bit/64] |= 1 << (bit % 64)
	}
}

func (s *sectorSet) has(sec int64) bool {
	pg := s.pages[sec/pageSectors]
	if pg == nil {
		return false
	}
	bit := sec % pageSectors
	return pg[bit/64]&(1<<(bit%64)) != 0
}

// eachStale calls fn for each maximal run of [off, off+n) whose sectors are not in the
// set, until fn returns false. A nil set holds nothing.
func (s *sectorSet) eachStale(off, n int64, fn func(off, n int64) bool) {
	end := off + n
	if s == nil || len(s.pages) == 0 {
		if n > 0 {
			fn(off, n)
		}
		return
	}
	runStart := int64(-1)
	for o := off; o < end; {
		sec := o / SectorSize
		next := min((sec+1)*SectorSize, end)
		if s.has(sec) {
			if runStart >= 0 {
				if !fn(runStart, o-runStart) {
					return
				}
				runStart = -1
			}
		} else if runStart < 0 {
			runStart = o
		}
		o = next
	}
	if runStart >= 0 {
		fn(runStart, end-runStart)
	}
}
