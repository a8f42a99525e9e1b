package replica

import (
	"bufio"
	"net"
	"sync"
	"time"
)

// frameWriter writes frames to a connection from the goroutine that has one to send, with no
// writer goroutine to hand it to: the sender that finds the connection free writes its frame
// and whatever other senders queued meanwhile, then flushes them together — one TLS record
// and one system call for all of them. At a low rate a frame costs no goroutine hand-off (a
// wake-up of another thread, as dear as the write itself); at a high rate frames share
// their system call.
//
// A sender writes at most maxRounds batches, then leaves what is still queued to a goroutine
// of its own, so that one caller's latency does not grow with everyone else's load.
type frameWriter[F any] struct {
	nc    net.Conn
	bw    *bufio.Writer
	write func(*bufio.Writer, F) error // encodes one frame into bw
	drop  func(F)                      // releases a frame that is never written
	fail  func(error)                  // ends the connection after a write error

	// mu guards the queue and err; wmu is held by the one sender writing to bw and nc.
	// Lock order: wmu, then mu.
	mu       sync.Mutex
	queue    []queued[F]
	spare    []queued[F]
	err      error
	wmu      sync.Mutex
	deadline time.Time // nc's write deadline as last set
}

type queued[F any] struct {
	f        F
	deadline time.Time // zero: none
}

// maxRounds bounds the batches one sender writes for others before handing the rest on.
const maxRounds = 4

func newFrameWriter[F any](nc net.Conn, write func(*bufio.Writer, F) error, drop func(F), fail func(error)) *frameWriter[F] {
	return &frameWriter[F]{nc: nc, bw: bufio.NewWriterSize(nc, 64<<10), write: write, drop: drop, fail: fail}
}

// send queues fs and writes them unless another sender is writing (it then writes them
// too). A write that has not completed by deadline (zero: none) fails the connection: a
// peer that takes no bytes is as good as gone. After the connection failed, fs are dropped
// and the error returned.
func (w *frameWriter[F]) send(deadline time.Time, fs ...F) error {
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		for _, f := range fs {
			w.drop(f)
		}
		return err
	}
	for _, f := range fs {
		w.queue = append(w.queue, queued[F]{f, deadline})
	}
	w.mu.Unlock()
	if w.wmu.TryLock() {
		w.drain(maxRounds)
	}
	return nil
}

// drain writes batches while frames are queued, holding wmu, which it releases. After
// rounds batches it hands the rest to a goroutine (rounds < 0: no bound).
func (w *frameWriter[F]) drain(rounds int) {
	for ; ; rounds-- {
		w.mu.Lock()
		batch := w.queue
		if len(batch) == 0 || w.err != nil {
			// Released under mu: a sender that queues after this sees wmu free and takes it.
			w.wmu.Unlock()
			w.mu.Unlock()
			return
		}
		if rounds == 0 {
			w.mu.Unlock()
			go w.drain(-1) // keeps wmu
			return
		}
		w.queue = w.spare[:0]
		w.mu.Unlock()

		err := w.writeBatch(batch)
		clear(batch)
		w.mu.Lock()
		w.spare = batch[:0]
		if err != nil && w.err == nil {
			w.err = err
		}
		w.mu.Unlock()
		if err != nil {
			w.wmu.Unlock()
			w.fail(err)
			w.dropQueued()
			return
		}
	}
}

func (w *frameWriter[F]) writeBatch(batch []queued[F]) error {
	// The connection's deadline is the latest of the batch's, none if one has none. A
	// frame whose deadline passed while it was queued is not sent: its caller has given up
	// on it, or is about to.
	now := time.Now()
	var deadline time.Time
	n := 0
	for _, q := range batch {
		switch {
		case q.deadline.IsZero():
			deadline = time.Time{}
		case !q.deadline.After(now):
			w.drop(q.f)
			continue
		case n == 0 || (!deadline.IsZero() && q.deadline.After(deadline)):
			deadline = q.deadline
		}
		batch[n] = q
		n++
	}
	batch = batch[:n]
	if n == 0 {
		return nil
	}
	if !deadline.Equal(w.deadline) {
		if err := w.nc.SetWriteDeadline(deadline); err != nil {
			for _, q := range batch {
				w.drop(q.f)
			}
			return err
		}
		w.deadline = deadline
	}
	var err error
	for _, q := range batch {
		if err == nil {
			err = w.write(w.bw, q.f)
			continue
		}
		w.drop(q.f)
	}
	if err == nil {
		err = w.bw.Flush()
	}
	return err
}

// close makes later sends fail with err and drops what is queued; a sender writing now
// finishes (the connection is closed under it by the caller).
func (w *frameWriter[F]) close(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.mu.Unlock()
	w.dropQueued()
}

func (w *frameWriter[F]) dropQueued() {
	w.mu.Lock()
	q := w.queue
	w.queue = nil
	w.mu.Unlock()
	for _, x := range q {
		w.drop(x.f)
	}
}
