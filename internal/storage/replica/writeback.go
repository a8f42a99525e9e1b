package replica

import (
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// writebackEvery is how many bytes a replica takes in between two starts of writeback.
//
// Writes land in the page cache and become durable at the next Flush (fdatasync). Left
// alone, the kernel writes them back only when they are old (30 s) or when dirty pages
// pass a share of memory (gigabytes on a large host); until then the disk sits idle and a
// volume's fsync then waits for all of it at once, as a file system's journal commit does.
// Starting writeback every few MiB (as RocksDB's bytes_per_sync does) keeps the disk busy
// while the writes arrive, so a Flush finds little left to write. It is a hint: what is
// durable still depends on Flush alone.
const writebackEvery = 8 << 20

// writeback starts the kernel's writeback of a replica's dirty pages once writebackEvery
// bytes were written since it last did, off the write path.
type writeback struct {
	unsynced atomic.Int64
	kick     chan struct{} // capacity 1: one start pending is enough
	done     chan struct{}
}

func newWriteback(r *replica) *writeback {
	w := &writeback{kick: make(chan struct{}, 1), done: make(chan struct{})}
	go w.run(r)
	return w
}

// wrote counts n bytes written and wakes run when enough have gathered. A nil writeback
// (a read-only snapshot's) does nothing.
func (w *writeback) wrote(n int) {
	if w == nil {
		return
	}
	if w.unsynced.Add(int64(n)) < writebackEvery {
		return
	}
	w.unsynced.Store(0)
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *writeback) run(r *replica) {
	for {
		select {
		case <-w.kick:
		case <-w.done:
			return
		}
		// SYNC_FILE_RANGE_WRITE submits the dirty pages of the whole file (offset 0,
		// length 0: to its end) and does not wait for them; it may block while it
		// submits, which is why it runs here and not in a write. An error (the file
		// closed under it) only means nothing was started.
		_ = r.withFd(func(fd int) error { return unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WRITE) })
	}
}

func (w *writeback) stop() {
	if w != nil {
		close(w.done)
	}
}
