package safefile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// noFollow is added to every open: the last path element must not be a symlink.
const noFollow = unix.O_NOFOLLOW | unix.O_CLOEXEC

// Write replaces path with data, atomically and durably, with permissions perm. A symlink at
// path is replaced, not followed.
func Write(path string, data []byte, perm os.FileMode) (err error) {
	return WriteFrom(path, perm, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
}

// WriteFrom is Write for content that fill produces in the new file f (by writing, or by
// sizing it with Truncate for a sparse file). Until fill returns and the file is synced, path
// keeps its old content.
func WriteFrom(path string, perm os.FileMode, fill func(f *os.File) error) (err error) {
	dir := filepath.Dir(path)
	tmp, f, err := createTemp(path, perm)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := fill(f); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return SyncDir(dir)
}

// createTemp creates a new file next to path. O_EXCL also refuses a symlink planted at the
// temporary name; the random suffix keeps two writers of one path apart.
func createTemp(path string, perm os.FileMode) (string, *os.File, error) {
	for range 10 {
		var b [6]byte
		if _, err := rand.Read(b[:]); err != nil {
			return "", nil, err
		}
		tmp := tempPrefix(path) + hex.EncodeToString(b[:])
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|noFollow, perm)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return "", nil, fmt.Errorf("writing %s: %w", path, err)
		}
		return tmp, f, nil
	}
	return "", nil, fmt.Errorf("writing %s: no free temporary name", path)
}

func tempPrefix(path string) string {
	return filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
}

// RemoveTemporaries removes the temporary files that writes of path interrupted by a crash
// left behind.
func RemoveTemporaries(path string) error {
	leftovers, err := filepath.Glob(globEscape(tempPrefix(path)) + "*")
	if err != nil {
		return err
	}
	for _, l := range leftovers {
		if err := os.Remove(l); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

func globEscape(s string) string {
	return strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`).Replace(s)
}

// SyncDir fsyncs a directory, making the creates, renames and removes in it durable.
func SyncDir(dir string) error {
	d, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|noFollow, 0)
	if err != nil {
		return fmt.Errorf("syncing directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing directory %s: %w", dir, err)
	}
	return nil
}

// ReadFile reads path, refusing a symlink.
func ReadFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|noFollow, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// OpenFile is os.OpenFile refusing a symlink at path: for lock and log files, which are
// opened in place rather than replaced.
func OpenFile(path string, flag int, perm os.FileMode) (*os.File, error) {
	return os.OpenFile(path, flag|noFollow, perm)
}
