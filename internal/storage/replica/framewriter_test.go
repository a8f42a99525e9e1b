package replica

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// frame of a test: its sender and its number in that sender's sequence, 8 bytes.
type testFrame struct{ sender, seq uint32 }

func writeTestFrame(bw *bufio.Writer, f testFrame) error {
	var b [8]byte
	binary.BigEndian.PutUint32(b[:], f.sender)
	binary.BigEndian.PutUint32(b[4:], f.seq)
	_, err := bw.Write(b[:])
	return err
}

// Every frame of concurrent senders arrives exactly once, each sender's in its order.
func TestFrameWriterDeliversEveryFrameOnceInOrder(t *testing.T) {
	const senders, each = 8, 2000
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	var dropped atomic.Int64
	w := newFrameWriter(a, writeTestFrame, func(testFrame) { dropped.Add(1) }, func(err error) { t.Errorf("failed: %v", err) })
	got := make(chan error, 1)
	go func() {
		next := make([]uint32, senders)
		br := bufio.NewReader(b)
		var f [8]byte
		for n := 0; n < senders*each; n++ {
			if _, err := io.ReadFull(br, f[:]); err != nil {
				got <- err
				return
			}
			s, seq := binary.BigEndian.Uint32(f[:]), binary.BigEndian.Uint32(f[4:])
			if s >= senders || seq != next[s] {
				got <- errors.New("a frame out of order, twice, or foreign")
				return
			}
			next[s]++
		}
		got <- nil
	}()
	var wg sync.WaitGroup
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := w.send(time.Now().Add(time.Minute), testFrame{uint32(s), uint32(i)}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("not every frame arrived")
	}
	if n := dropped.Load(); n != 0 {
		t.Fatalf("%d frames dropped", n)
	}
}

// A peer that takes no bytes fails the connection at the frame's deadline, instead of
// holding its sender forever; what is queued then and sent later is dropped, once each.
func TestFrameWriterFailsAtTheDeadlineOfAPeerThatDoesNotRead(t *testing.T) {
	a, b := net.Pipe() // nothing reads b
	defer a.Close()
	defer b.Close()
	var dropped atomic.Int64
	failed := make(chan error, 1)
	big := func(bw *bufio.Writer, f testFrame) error {
		_, err := bw.Write(make([]byte, 128<<10)) // larger than the buffer: written through
		return err
	}
	w := newFrameWriter(a, big, func(testFrame) { dropped.Add(1) }, func(err error) { failed <- err })
	start := time.Now()
	sent := make(chan error, 1)
	go func() { sent <- w.send(time.Now().Add(200*time.Millisecond), testFrame{}) }()
	select {
	case err := <-failed:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("failed with %v, want a timeout", err)
		}
		if time.Since(start) < 200*time.Millisecond {
			t.Fatalf("failed after %v, before the deadline", time.Since(start))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a sender to a peer that does not read was held past its deadline")
	}
	if err := <-sent; err != nil {
		t.Fatalf("the first send reports the failure to its caller through fail, not itself: %v", err)
	}
	if err := w.send(time.Time{}, testFrame{}, testFrame{}); err == nil {
		t.Fatal("a send after the failure succeeded")
	}
	if n := dropped.Load(); n != 2 {
		t.Fatalf("%d frames dropped after the failure, want 2", n)
	}
}

// A frame whose deadline passed while it was queued is dropped, not sent; the next is sent.
func TestFrameWriterDropsFramesPastTheirDeadline(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	var dropped atomic.Int64
	w := newFrameWriter(a, writeTestFrame, func(testFrame) { dropped.Add(1) }, func(err error) { t.Errorf("failed: %v", err) })
	read := make(chan testFrame, 2)
	go func() {
		var f [8]byte
		for {
			if _, err := io.ReadFull(b, f[:]); err != nil {
				return
			}
			read <- testFrame{binary.BigEndian.Uint32(f[:]), binary.BigEndian.Uint32(f[4:])}
		}
	}()
	if err := w.send(time.Now().Add(-time.Second), testFrame{1, 1}); err != nil {
		t.Fatal(err)
	}
	if err := w.send(time.Now().Add(time.Minute), testFrame{2, 2}); err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-read:
		if f != (testFrame{2, 2}) {
			t.Fatalf("read %v, want the frame in time", f)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the frame in time was not sent")
	}
	if n := dropped.Load(); n != 1 {
		t.Fatalf("%d frames dropped, want the one past its deadline", n)
	}
}
