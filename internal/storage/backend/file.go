package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/safefile"
)

// File keeps pools as directories under Root/pools and replicas as sparse files,
// Root/pools/<pool>/<namespace>/<replica>.img.
type File struct {
	Root string
}

// NewFile returns a file backend rooted at root (created on first use).
func NewFile(root string) *File { return &File{Root: root} }

// markerName is the file that makes a directory a pool. Its absence in an existing pool
// directory means the pool was damaged, not that it may be created again.
const markerName = ".crdipc-pool.json"

const replicaSuffix = ".img"

// MetaSuffix names the replica data service's metadata file beside a replica file
// (revision, dirty and rebuilding flags); it goes with the replica.
const MetaSuffix = ".meta"

type poolMarker struct {
	Name     string                   `json:"name"`
	Type     storagev1alpha1.PoolType `json:"type,omitempty"`
	Capacity int64                    `json:"capacity"`
	Created  time.Time                `json:"created"`
}

// PoolDir is the directory of pool name.
func (f *File) PoolDir(name string) string { return filepath.Join(f.Root, "pools", name) }

// ReplicaPath is the file of replica r in pool.
func (f *File) ReplicaPath(pool string, r Replica) string {
	return filepath.Join(f.PoolDir(pool), r.Namespace, r.Name+replicaSuffix)
}

// ReplicaFile is ReplicaPath for names that come from the API: it refuses any name that is
// not one plain path element, so the file always lies inside the pool's directory.
func (f *File) ReplicaFile(pool string, r Replica) (string, error) {
	if err := checkNames(pool, &r); err != nil {
		return "", err
	}
	return f.ReplicaPath(pool, r), nil
}

// checkNames refuses a pool, namespace or replica name that would lead out of the
// directory it names an entry of ("..", "a/b", ""). Object names the API server admits never
// do; this holds the line should one reach here otherwise.
func checkNames(pool string, r *Replica) error {
	names := []string{pool}
	if r != nil {
		names = append(names, r.Namespace, r.Name)
	}
	for _, n := range names {
		if n == "" || n == "." || n == ".." || strings.ContainsAny(n, "/\x00") {
			return fmt.Errorf("%q is not a name the file backend can store under %s", n, "pools/")
		}
	}
	return nil
}

// CreatePool implements Backend.
func (f *File) CreatePool(ctx context.Context, p Pool) (PoolState, error) {
	if err := ctx.Err(); err != nil {
		return PoolState{}, err
	}
	if err := checkNames(p.Name, nil); err != nil {
		return PoolState{}, err
	}
	dir := f.PoolDir(p.Name)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return PoolState{}, fmt.Errorf("creating pool directory: %w", err)
	}
	m, err := readMarker(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// New, or a create that was interrupted before the marker: finish it.
		data, _ := json.Marshal(poolMarker{Name: p.Name, Type: p.Type, Capacity: p.Capacity, Created: time.Now().UTC()})
		if err := safefile.Write(filepath.Join(dir, markerName), data, 0o640); err != nil {
			return PoolState{}, fmt.Errorf("writing pool marker: %w", err)
		}
	case err != nil:
		return PoolState{}, err
	case m.Name != p.Name:
		return PoolState{}, fmt.Errorf("directory %s belongs to pool %q", dir, m.Name)
	}
	return f.poolState(dir, p)
}

// ImportPool implements Backend.
func (f *File) ImportPool(ctx context.Context, p Pool) (PoolState, error) {
	if err := ctx.Err(); err != nil {
		return PoolState{}, err
	}
	if err := checkNames(p.Name, nil); err != nil {
		return PoolState{}, err
	}
	if err := f.checkPool(p); err != nil {
		return PoolState{}, err
	}
	return f.poolState(f.PoolDir(p.Name), p)
}

// checkPool checks that p's directory exists and is p's: ErrNotFound if it is gone.
func (f *File) checkPool(p Pool) error {
	dir := f.PoolDir(p.Name)
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("pool directory %s: %w", dir, ErrNotFound)
		}
		return fmt.Errorf("pool directory: %w", err)
	}
	m, err := readMarker(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("pool directory %s has lost its %s: damaged", dir, markerName)
	}
	if err != nil {
		return err
	}
	if m.Name != p.Name {
		return fmt.Errorf("directory %s belongs to pool %q", dir, m.Name)
	}
	return nil
}

// DeletePool implements Backend.
func (f *File) DeletePool(ctx context.Context, p Pool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkNames(p.Name, nil); err != nil {
		return err
	}
	if err := os.RemoveAll(f.PoolDir(p.Name)); err != nil {
		return fmt.Errorf("removing pool directory: %w", err)
	}
	return nil
}

// CreateReplica implements Backend. The file appears under its final name only once it
// has its full size (temporary name, then rename), so an interrupted create never
// leaves a replica that looks complete; leftovers are removed on the next attempt.
func (f *File) CreateReplica(ctx context.Context, p Pool, r Replica) (ReplicaState, error) {
	if err := ctx.Err(); err != nil {
		return ReplicaState{}, err
	}
	if err := checkNames(p.Name, &r); err != nil {
		return ReplicaState{}, err
	}
	if err := f.checkPool(p); err != nil {
		return ReplicaState{}, fmt.Errorf("pool %s: %w", p.Name, err)
	}
	path := f.ReplicaPath(p.Name, r)
	st, err := statReplica(path)
	if err == nil {
		// Smaller: spec.capacity grew before this replica was recorded as created; larger
		// cannot come from a spec that never shrinks, so it is someone else's file.
		if st.Size > r.Capacity {
			return ReplicaState{}, fmt.Errorf("replica file %s exists with size %d, want %d", path, st.Size, r.Capacity)
		}
		if st.Size < r.Capacity {
			return f.grow(p, r, path)
		}
		return st, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return ReplicaState{}, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return ReplicaState{}, fmt.Errorf("creating replica directory: %w", err)
	}
	if err := safefile.RemoveTemporaries(path); err != nil {
		return ReplicaState{}, fmt.Errorf("creating replica file: %w", err)
	}
	err = safefile.WriteFrom(path, 0o640, func(file *os.File) error {
		return file.Truncate(r.Capacity) // sparse: no blocks are allocated until written
	})
	if err != nil {
		return ReplicaState{}, fmt.Errorf("creating replica file: %w", err)
	}
	return statReplica(path)
}

// GrowReplica implements Backend: the file is extended in place (sparse, so no blocks are
// allocated) while the data service may have it open, and the new size is made durable.
func (f *File) GrowReplica(ctx context.Context, p Pool, r Replica) (ReplicaState, error) {
	if err := ctx.Err(); err != nil {
		return ReplicaState{}, err
	}
	if err := checkNames(p.Name, &r); err != nil {
		return ReplicaState{}, err
	}
	if r.Capacity <= 0 {
		return ReplicaState{}, fmt.Errorf("growing replica %s/%s to %d bytes: capacity must be positive", r.Namespace, r.Name, r.Capacity)
	}
	if err := f.checkPool(p); err != nil {
		return ReplicaState{}, fmt.Errorf("pool %s: %w", p.Name, err)
	}
	path := f.ReplicaPath(p.Name, r)
	st, err := statReplica(path)
	if err != nil || st.Size >= r.Capacity {
		return st, err
	}
	return f.grow(p, r, path)
}

// grow extends the existing replica file at path to r.Capacity if the pool has room for
// the difference (replicas are thin: the room is what the pool promised, not what is
// written).
func (f *File) grow(p Pool, r Replica, path string) (ReplicaState, error) {
	st, err := statReplica(path)
	if err != nil || st.Size >= r.Capacity {
		return st, err
	}
	ps, err := f.poolState(f.PoolDir(p.Name), p)
	if err != nil {
		return ReplicaState{}, err
	}
	if need := r.Capacity - st.Size; need > ps.Free {
		return ReplicaState{}, fmt.Errorf("growing replica %s/%s from %d to %d bytes needs %d more, pool %s has %d free: %w",
			r.Namespace, r.Name, st.Size, r.Capacity, need, p.Name, ps.Free, ErrNoSpace)
	}
	file, err := safefile.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return ReplicaState{}, fmt.Errorf("growing replica file: %w", err)
	}
	err = file.Truncate(r.Capacity) // sparse: the new range is a hole
	if err == nil {
		err = file.Sync()
	}
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = safefile.SyncDir(filepath.Dir(path))
	}
	if err != nil {
		return ReplicaState{}, fmt.Errorf("growing replica file %s to %d bytes: %w", path, r.Capacity, err)
	}
	return statReplica(path)
}

// StatReplica implements Backend.
func (f *File) StatReplica(ctx context.Context, p Pool, r Replica) (ReplicaState, error) {
	if err := ctx.Err(); err != nil {
		return ReplicaState{}, err
	}
	path, err := f.ReplicaFile(p.Name, r)
	if err != nil {
		return ReplicaState{}, err
	}
	return statReplica(path)
}

// DeleteReplica implements Backend.
func (f *File) DeleteReplica(ctx context.Context, p Pool, r Replica) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	path, err := f.ReplicaFile(p.Name, r)
	if err != nil {
		return err
	}
	if err := removeSnapshots(path); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing replica file: %w", err)
	}
	if err := os.Remove(path + MetaSuffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing replica metadata: %w", err)
	}
	// What interrupted writes of the file or its metadata left.
	if err := errors.Join(safefile.RemoveTemporaries(path), safefile.RemoveTemporaries(path+MetaSuffix)); err != nil {
		return fmt.Errorf("removing replica temporaries: %w", err)
	}
	_ = os.Remove(filepath.Dir(path)) // the namespace directory, if now empty
	return nil
}

// The replica data service keeps a replica's snapshots beside its file, as
// <file>.snap.<name>.data and <file>.snap.<name>.snapmeta (package replica, SnapshotFiles);
// they go with the replica. No replica's own file (.img) or metadata (.img.meta) ends so,
// whatever its name.
const (
	snapshotInfix      = ".snap."
	snapshotDataSuffix = ".data"
	snapshotMetaSuffix = ".snapmeta"
)

// removeSnapshots removes the snapshots of the replica file at path, with the temporaries
// that interrupted writes of their metadata left.
func removeSnapshots(path string) error {
	dir, base := filepath.Split(path)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing replica snapshots: %w", err)
	}
	removed := false
	for _, e := range entries {
		n := e.Name()
		snapshot := strings.HasPrefix(n, base+snapshotInfix) &&
			(strings.HasSuffix(n, snapshotDataSuffix) || strings.HasSuffix(n, snapshotMetaSuffix))
		temporary := strings.HasPrefix(n, "."+base+snapshotInfix) && strings.Contains(n, snapshotMetaSuffix+".tmp-")
		if !snapshot && !temporary {
			continue
		}
		if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing replica snapshot: %w", err)
		}
		removed = true
	}
	if removed {
		if err := safefile.SyncDir(dir); err != nil {
			return fmt.Errorf("removing replica snapshots: %w", err)
		}
	}
	return nil
}

func statReplica(path string) (ReplicaState, error) {
	fi, err := os.Lstat(path) // a symlink is not a replica file
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return ReplicaState{}, fmt.Errorf("replica file %s: %w", path, ErrNotFound)
		}
		return ReplicaState{}, fmt.Errorf("replica file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return ReplicaState{}, fmt.Errorf("replica file %s is not a regular file", path)
	}
	return ReplicaState{Location: path, Size: fi.Size(), Allocated: allocated(fi)}, nil
}

func allocated(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int64(st.Blocks) * 512 // st_blocks is in 512-byte units on Linux and macOS
	}
	return fi.Size()
}

// poolState measures a pool: statfs for the file system, the replica files for Used.
func (f *File) poolState(dir string, p Pool) (PoolState, error) {
	var used int64
	namespaces, err := os.ReadDir(dir)
	if err != nil {
		return PoolState{}, fmt.Errorf("reading pool directory: %w", err)
	}
	for _, ns := range namespaces {
		if !ns.IsDir() {
			continue
		}
		files, err := os.ReadDir(filepath.Join(dir, ns.Name()))
		if err != nil {
			return PoolState{}, fmt.Errorf("reading pool directory: %w", err)
		}
		for _, file := range files {
			if !strings.HasSuffix(file.Name(), replicaSuffix) {
				continue
			}
			if fi, err := file.Info(); err == nil {
				used += fi.Size()
			}
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return PoolState{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	const mib = 1 << 20
	fsTotal := int64(st.Blocks) * int64(st.Bsize)
	// Rounded down to MiB so that other writers on a shared disk do not change the
	// pool's status on every resync.
	fsAvail := int64(st.Bavail) * int64(st.Bsize) / mib * mib
	total := min(p.Capacity, fsTotal)
	return PoolState{Location: dir, Total: total, Used: used, Free: max(0, min(total-used, fsAvail)), Full: fsAvail == 0}, nil
}

func readMarker(dir string) (poolMarker, error) {
	var m poolMarker
	data, err := safefile.ReadFile(filepath.Join(dir, markerName))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("pool marker in %s is damaged: %w", dir, err)
	}
	return m, nil
}
