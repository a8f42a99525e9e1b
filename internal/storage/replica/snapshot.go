package replica

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/crdipc/crdipc/internal/safefile"
	"golang.org/x/sys/unix"
)

// SnapshotInfo describes a snapshot of a replica, as Client.Snapshot reports it.
type SnapshotInfo struct {
	// ID names the snapshot as a read-only replica ("<replica id>@<name>", SnapshotID) for
	// Info, Extents, ReadAt and as the source of a Rebuild.
	ID   string `json:"id"`
	Name string `json:"name"`
	// Size is the replica's size when the snapshot was taken; Revision and Epoch are its
	// revision and writer-session epoch then.
	Size     int64     `json:"size"`
	Revision uint64    `json:"revision"`
	Epoch    uint64    `json:"epoch"`
	Time     time.Time `json:"time"`
	// Reflink: the copy shares the data's blocks (FICLONE) instead of being a sparse copy
	// of its allocated extents.
	Reflink bool `json:"reflink"`
	// Allocated is the space the snapshot's file occupies (st_blocks; shared blocks count).
	Allocated int64 `json:"allocated"`
	// Created: this call took the snapshot; false when a complete one of that name existed.
	Created bool `json:"created"`
}

// snapMeta is a snapshot's durable metadata. The snapshot exists iff this file does.
type snapMeta struct {
	Size     int64     `json:"size"`
	Revision uint64    `json:"revision"`
	Epoch    uint64    `json:"epoch"`
	Time     time.Time `json:"time"`
	Reflink  bool      `json:"reflink,omitempty"`
}

var snapshotName = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,127}$`)

// ValidateSnapshotName accepts 1 to 128 characters of lower-case letters, digits, '.' and
// '-', starting with a letter or digit; anything else is refused with ErrInvalid.
func ValidateSnapshotName(name string) error {
	if !snapshotName.MatchString(name) {
		return fmt.Errorf("snapshot name %q: want [a-z0-9][a-z0-9.-]{0,127}: %w", name, ErrInvalid)
	}
	return nil
}

// SnapshotID is the id under which snapshot name of replica replicaID is served read-only.
func SnapshotID(replicaID, name string) string { return replicaID + "@" + name }

// SplitSnapshotID splits a snapshot id into the replica's id and the snapshot's name; ok is
// false for an id that names no snapshot. The name is not validated.
func SplitSnapshotID(id string) (replicaID, name string, ok bool) {
	return strings.Cut(id, "@")
}

// SnapshotFiles are the data and metadata files of snapshot name of the replica whose
// data file is data: "<data>.snap.<name>.data" and "<data>.snap.<name>.snapmeta". The
// distinct suffixes keep every name's files apart from every other name's, and from a
// replica's own files (a node's "<replica>.img" and "<replica>.img.meta") whatever the
// replica's name.
func SnapshotFiles(data, name string) (dataFile, metaFile string) {
	base := data + ".snap." + name
	return base + ".data", base + ".snapmeta"
}

// SnapshotNames lists the snapshots kept beside the replica data file data: the names
// whose metadata file is there (a snapshot exists iff it is), in no particular order.
func SnapshotNames(data string) ([]string, error) {
	dir, base := filepath.Split(data)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing the snapshots of %s: %w", data, err)
	}
	var names []string
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), base+".snap.")
		if !ok {
			continue
		}
		if name, ok := strings.CutSuffix(rest, ".snapmeta"); ok && ValidateSnapshotName(name) == nil {
			names = append(names, name)
		}
	}
	return names, nil
}

func readSnapMeta(path string) (snapMeta, error) {
	var m snapMeta
	data, err := safefile.ReadFile(path)
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("parsing snapshot metadata %s: %w", path, err)
	}
	return m, nil
}

func (s *Server) snapshotInfo(replicaID, name, dataFile string, m snapMeta, created bool) SnapshotInfo {
	in := SnapshotInfo{
		ID: SnapshotID(replicaID, name), Name: name, Size: m.Size, Revision: m.Revision,
		Epoch: m.Epoch, Time: m.Time, Reflink: m.Reflink, Created: created,
	}
	if st, err := os.Lstat(dataFile); err == nil {
		in.Allocated = allocatedBytes(st)
	}
	return in
}

func allocatedBytes(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return 0
}

// refMutex is a mutex shared by the users of one key, dropped when the last lets go.
type refMutex struct {
	sync.Mutex
	refs int
}

// lockSnapshots serializes taking and deleting the snapshots of replica id.
func (s *Server) lockSnapshots(id string) (unlock func()) {
	s.mu.Lock()
	l := s.snapLocks[id]
	if l == nil {
		l = &refMutex{}
		s.snapLocks[id] = l
	}
	l.refs++
	s.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		s.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(s.snapLocks, id)
		}
		s.mu.Unlock()
	}
}

// snapshot takes snapshot name of r for its writer session, or reports the complete one
// that exists. A partial one (data file without metadata, as a crash or failure leaves)
// is taken again.
func (s *Server) snapshot(r *replica, name string) (SnapshotInfo, error) {
	unlock := s.lockSnapshots(r.id)
	defer unlock()
	dataFile, metaFile := SnapshotFiles(r.dataPath, name)
	m, err := readSnapMeta(metaFile)
	if err == nil {
		return s.snapshotInfo(r.id, name, dataFile, m, false), nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return SnapshotInfo{}, err
	}
	if r.deleted() {
		return SnapshotInfo{}, fmt.Errorf("replica file of %s was deleted: %w", r.id, ErrNotFound)
	}
	// Writes wait from here until the copy is complete; reads go on.
	r.applyMu.Lock()
	m, reflink, err := s.takeSnapshot(r, dataFile, metaFile)
	r.applyMu.Unlock()
	if err != nil {
		// Without metadata it is no snapshot; removing the copy frees its space at once.
		if rerr := os.Remove(dataFile); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			s.log.Error(rerr, "removing a failed snapshot's copy", "replica", r.id, "snapshot", name)
		}
		return SnapshotInfo{}, err
	}
	s.log.Info("snapshot taken", "replica", r.id, "snapshot", name, "revision", m.Revision, "reflink", reflink)
	return s.snapshotInfo(r.id, name, dataFile, m, true), nil
}

// takeSnapshot copies r's data to dataFile and then writes metaFile; applyMu is held, so
// no write is applied meanwhile and the revision read first covers exactly the data copied.
func (s *Server) takeSnapshot(r *replica, dataFile, metaFile string) (snapMeta, bool, error) {
	if r.durable().Rebuilding {
		// Checked under applyMu, which a rebuild's punch needs too.
		return snapMeta{}, false, fmt.Errorf("replica %s is rebuilding, its data is incomplete: %w", r.id, ErrInvalid)
	}
	m := snapMeta{Size: r.size.Load(), Revision: r.rev.Load(), Epoch: r.durable().Epoch}
	if err := r.datasync(); err != nil {
		return m, false, err
	}
	if err := os.Remove(dataFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return m, false, fmt.Errorf("removing a partial snapshot: %w", err)
	}
	if err := safefile.RemoveTemporaries(metaFile); err != nil {
		return m, false, fmt.Errorf("removing a partial snapshot: %w", err)
	}
	dst, err := safefile.OpenFile(dataFile, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return m, false, fmt.Errorf("creating snapshot file: %w", noSpace(err))
	}
	reflink, err := r.copyTo(dst, m.Size, !s.testNoReflink)
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return m, false, fmt.Errorf("copying replica %s to its snapshot: %w", r.id, noSpace(err))
	}
	m.Time = time.Now().UTC()
	m.Reflink = reflink
	data, err := json.Marshal(m)
	if err != nil {
		return m, false, err
	}
	// Atomic and durable, with a directory fsync that also keeps the data file's name.
	if err := safefile.Write(metaFile, data, 0o600); err != nil {
		return m, false, fmt.Errorf("writing snapshot metadata: %w", noSpace(err))
	}
	return m, reflink, nil
}

// copyTo makes dst, a new empty file, hold the first size bytes of r: a reflink (FICLONE)
// where the file system can share blocks and reflink is allowed, else a sparse copy of
// the allocated extents (SEEK_DATA/SEEK_HOLE, copy_file_range), holes staying holes.
func (r *replica) copyTo(dst *os.File, size int64, reflink bool) (cloned bool, err error) {
	rc, err := dst.SyscallConn()
	if err != nil {
		return false, err
	}
	cerr := rc.Control(func(dfd uintptr) {
		err = r.withFd(func(sfd int) error {
			if reflink {
				switch cloneErr := unix.IoctlFileClone(int(dfd), sfd); {
				case cloneErr == nil:
					cloned = true
					return nil
				case !cloneUnsupported(cloneErr):
					return fmt.Errorf("FICLONE: %w", cloneErr)
				}
			}
			return sparseCopy(sfd, int(dfd), size)
		})
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		return false, err
	}
	// A clone takes the whole file, which may be longer than the replica; a sparse copy
	// stops at the last extent.
	if err := dst.Truncate(size); err != nil {
		return false, err
	}
	return cloned, nil
}

// cloneUnsupported: the file system (or the pair of files) cannot share blocks.
func cloneUnsupported(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) ||
		errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.ENOSYS)
}

// sparseCopy copies the data extents of sfd within [0, size) to the same offsets of dfd.
func sparseCopy(sfd, dfd int, size int64) error {
	for off := int64(0); off < size; {
		d, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // no data past off
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		if d >= size {
			return nil
		}
		h, err := unix.Seek(sfd, d, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		h = min(h, size)
		if err := copyRange(sfd, dfd, d, h-d); err != nil {
			return err
		}
		off = h
	}
	return nil
}

// copyRange copies [off, off+n) with copy_file_range, or with pread/pwrite where the
// kernel cannot.
func copyRange(sfd, dfd int, off, n int64) error {
	roff, woff := off, off
	for n > 0 {
		k, err := unix.CopyFileRange(sfd, &roff, dfd, &woff, int(min(n, 1<<30)), 0)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL):
			return copyRangeRW(sfd, dfd, roff, n)
		case err != nil:
			return fmt.Errorf("copy_file_range: %w", err)
		case k == 0:
			return fmt.Errorf("copy_file_range: source ended at %d: %w", roff, io.ErrUnexpectedEOF)
		}
		n -= int64(k)
	}
	return nil
}

func copyRangeRW(sfd, dfd int, off, n int64) error {
	buf := make([]byte, min(n, 1<<20))
	for n > 0 {
		b := buf[:min(n, int64(len(buf)))]
		k, err := unix.Pread(sfd, b, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("pread: %w", err)
		}
		if k == 0 {
			return fmt.Errorf("pread: source ended at %d: %w", off, io.ErrUnexpectedEOF)
		}
		for w := 0; w < k; {
			m, err := unix.Pwrite(dfd, b[w:k], off+int64(w))
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return fmt.Errorf("pwrite: %w", err)
			}
			w += m
		}
		off += int64(k)
		n -= int64(k)
	}
	return nil
}

// deleteSnapshot removes snapshot name of replica id: metadata first, so the snapshot
// ceases to exist at once, then its data. A missing one is success.
func (s *Server) deleteSnapshot(id, name string) error {
	if id == "" {
		return fmt.Errorf("empty replica id: %w", ErrInvalid)
	}
	if _, _, ok := SplitSnapshotID(id); ok {
		return fmt.Errorf("delete a snapshot through its replica's id, not %q: %w", id, ErrInvalid)
	}
	if err := ValidateSnapshotName(name); err != nil {
		return err
	}
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing {
		return ErrClosed
	}
	loc, err := s.o.Lookup(id)
	if err != nil {
		return fmt.Errorf("no replica %s on node %s: %v: %w", id, s.o.Node, err, ErrNotFound)
	}
	unlock := s.lockSnapshots(id)
	defer unlock()
	dataFile, metaFile := SnapshotFiles(loc.Data, name)
	removed := false
	for _, p := range []string{metaFile, dataFile} {
		err := os.Remove(p)
		if err == nil {
			removed = true
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("deleting snapshot %s of %s: %w", name, id, err)
		}
	}
	if err := safefile.RemoveTemporaries(metaFile); err != nil {
		return fmt.Errorf("deleting snapshot %s of %s: %w", name, id, err)
	}
	if removed {
		if err := safefile.SyncDir(filepath.Dir(metaFile)); err != nil {
			return fmt.Errorf("deleting snapshot %s of %s: %w", name, id, err)
		}
		s.log.Info("snapshot deleted", "replica", id, "snapshot", name)
	}
	return nil
}

// openSnapshot opens snapshot name of the replica at loc as the read-only replica id.
func openSnapshot(id, name string, loc Location) (*replica, error) {
	dataFile, metaFile := SnapshotFiles(loc.Data, name)
	m, err := readSnapMeta(metaFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no snapshot %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	f, err := safefile.OpenFile(dataFile, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("snapshot %s has metadata but no data file %s: %w", name, dataFile, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("opening snapshot file: %w", err)
	}
	r := &replica{id: id, dataPath: dataFile, metaPath: metaFile, f: f, snap: true}
	r.size.Store(m.Size)
	r.m = meta{Revision: m.Revision, Epoch: m.Epoch}
	r.rev.Store(m.Revision)
	return r, nil
}
