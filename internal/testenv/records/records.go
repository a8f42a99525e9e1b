// Package records writes numbered, fixed-size records to a block device, each one synced
// before the next, the way a database logs: for tests of a data path that may pause but must
// never fail a write or lose an acknowledged one.
package records

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/mountinfo"
)

// Size is one record: a multiple of every logical block size, so that O_DIRECT takes it.
const Size = 4096

// Writer appends records 0, 1, 2, … to a device with O_DIRECT and fsync after each, until
// it is stopped, a write fails, or the device is full.
type Writer struct {
	f    *os.File
	stop chan struct{}
	done chan struct{}

	closeOnce sync.Once
	closeErr  error

	mu       sync.Mutex
	acked    int           // records written and synced
	maxPause time.Duration // the longest write + fsync
	err      error
}

// Start opens path (a block device) and starts writing. Stop ends it.
func Start(path string) (*Writer, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s for direct I/O: %w", path, err)
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("size of %s: %w", path, err)
	}
	w := &Writer{f: f, stop: make(chan struct{}), done: make(chan struct{})}
	go w.run(int(size / Size))
	return w, nil
}

// Record is record i's content.
func Record(i int) []byte {
	line := fmt.Sprintf("record %08d\n", i)
	return bytes.Repeat([]byte(line), Size/len(line)+1)[:Size]
}

func (w *Writer) run(n int) {
	defer close(w.done)
	// O_DIRECT wants a buffer aligned to the logical block size: take an aligned window.
	raw := make([]byte, 2*Size)
	buf := raw[Size-int(uintptrOf(raw)%Size):][:Size]
	for i := 0; i < n; i++ {
		select {
		case <-w.stop:
			return
		default:
		}
		copy(buf, Record(i))
		start := time.Now()
		_, err := w.f.WriteAt(buf, int64(i)*Size)
		if err == nil {
			err = w.f.Sync()
		}
		took := time.Since(start)
		w.mu.Lock()
		w.maxPause = max(w.maxPause, took)
		if err != nil {
			w.err = fmt.Errorf("record %d: %w", i, err)
			w.mu.Unlock()
			return
		}
		w.acked = i + 1
		w.mu.Unlock()
	}
}

// Acked is how many records have been written and synced.
func (w *Writer) Acked() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.acked
}

// Err is the first failed write or fsync, nil while none failed.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// MaxPause is the longest any record took to write and sync.
func (w *Writer) MaxPause() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.maxPause
}

// ErrStuck is returned by Stop when a write did not return in time: the data path hangs.
var ErrStuck = errors.New("a write did not return")

// Stop ends the writer after the write in flight and closes the device; calling it again
// returns what the first call that got that far returned. It waits at most timeout for
// that write; past it, it returns ErrStuck and leaves the device open (the caller must
// unblock the data path, e.g. abort it, before the test ends).
func (w *Writer) Stop(timeout time.Duration) error {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	select {
	case <-w.done:
		w.closeOnce.Do(func() { w.closeErr = w.f.Close() })
		return w.closeErr
	case <-time.After(timeout):
		return fmt.Errorf("%w within %s (%d records acknowledged)", ErrStuck, timeout, w.Acked())
	}
}

// Verify checks that r holds records 0 to n-1.
func Verify(r io.ReaderAt, n int) error {
	got := make([]byte, Size)
	for i := range n {
		if _, err := r.ReadAt(got, int64(i)*Size); err != nil {
			return fmt.Errorf("read record %d: %w", i, err)
		}
		if want := Record(i); !bytes.Equal(got, want) {
			return fmt.Errorf("record %d: got %q…, want %q…", i, got[:16], want[:16])
		}
	}
	return nil
}

// AbortFUSE aborts the FUSE connection mounted at dir through fusectl (mounted first if it
// is not), as the last resort of a test whose data path hangs: the blocked writes then fail
// with EIO. A process blocked on a connection it holds itself could not even exit.
func AbortFUSE(dir string) error {
	// Stat of the mount point itself would block on a hung server; the mount table does not.
	dev, ok := fuseDevAt(dir)
	if !ok {
		return fmt.Errorf("no FUSE mount at %s", dir)
	}
	const ctl = "/sys/fs/fuse/connections"
	if ents, _ := os.ReadDir(ctl); len(ents) == 0 {
		if err := unix.Mount("fusectl", ctl, "fusectl", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount fusectl: %w", err)
		}
	}
	p := fmt.Sprintf("%s/%d/abort", ctl, unix.Minor(dev))
	if err := os.WriteFile(p, []byte("1"), 0); err != nil {
		return fmt.Errorf("abort the FUSE connection at %s: %w", dir, err)
	}
	return nil
}

// fuseDevAt is the device number of the topmost FUSE mount at dir, from the mount table.
func fuseDevAt(dir string) (uint64, bool) {
	entries, err := mountinfo.Read(mountinfo.Self)
	if err != nil {
		return 0, false
	}
	var dev uint64
	found := false
	for _, e := range entries {
		if e.MountPoint != dir || (e.FSType != "fuse" && !strings.HasPrefix(e.FSType, "fuse.")) {
			continue
		}
		var ma, mi uint32
		if _, err := fmt.Sscanf(e.Dev, "%d:%d", &ma, &mi); err == nil {
			dev, found = unix.Mkdev(ma, mi), true
		}
	}
	return dev, found
}
