package replica

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// A large write is sent from the caller's buffer, not a copy of it; once WriteAt has
// returned, whatever its outcome, not one byte of that buffer may reach the server. The
// dangerous schedule: the write is given up on (its context ends) while its bytes are being
// sent, in a batch whose connection deadline is none because another frame of the batch has
// none. WriteAt must then end the connection (the frame is broken off) before it returns,
// rather than leave the writer sending from a buffer the caller is about to overwrite.
//
// The server side of the pipe reads only when the test lets it, so the schedule is the
// same on any machine: W1 holds the writer while X and Y queue; then the batch [X, Y] goes
// out until half of Y is read; then Y is given up on.
func TestWriteGivenUpOnWhileBeingSentSendsNothingAfterwards(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	conn := newConn("pipe", a)
	defer conn.Close()
	r := conn.Replica("ns/r")

	const w1Len, xLen, yLen = 256 << 10, 4 << 10, 1 << 20
	// Frames: a header and the replica id ahead of each payload.
	frame := func(n int) int { return 4 + reqHeaderLen + len("ns/r") + n }
	started, resume1, half, resume2 := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	got := make(chan []byte, 1)
	go func() {
		var all bytes.Buffer
		readTo := func(limit int) error {
			buf := make([]byte, 4<<10)
			for limit < 0 || all.Len() < limit {
				n := len(buf)
				if limit >= 0 {
					n = min(n, limit-all.Len())
				}
				n, err := b.Read(buf[:n])
				all.Write(buf[:n])
				if err != nil {
					return err
				}
			}
			return nil
		}
		// The first byte of W1; then W1, X and half of Y; then the rest, up to the end.
		if readTo(1) == nil {
			close(started)
			<-resume1
			if readTo(frame(w1Len)+frame(xLen)+frame(yLen/2)) == nil {
				close(half)
				<-resume2
				_ = readTo(-1)
			}
		}
		got <- all.Bytes()
	}()
	queued := func(n int) {
		t.Helper()
		err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			conn.w.mu.Lock()
			defer conn.w.mu.Unlock()
			return len(conn.w.queue) == n, nil
		})
		if err != nil {
			t.Fatalf("waiting for %d frames queued: %v", n, err)
		}
	}

	others := make(chan error, 2)
	go func() { others <- r.WriteAt(context.Background(), bytes.Repeat([]byte{'A'}, w1Len), 0, 1) }()
	<-started
	go func() { others <- r.WriteAt(context.Background(), bytes.Repeat([]byte{'X'}, xLen), 1<<20, 2) }()
	queued(1)
	y := bytes.Repeat([]byte{'C'}, yLen)
	ctx, giveUp := context.WithCancel(context.Background())
	defer giveUp()
	yDone := make(chan error, 1)
	go func() { yDone <- r.WriteAt(ctx, y, 2<<20, 3) }()
	queued(2)
	close(resume1)
	<-half
	giveUp()
	select {
	case err := <-yDone:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Y: %v, want it given up on", err)
		}
	case <-time.After(10 * time.Second):
		// Waiting for a writer that the server does not read from: the connection must end.
		t.Fatal("Y did not return once given up on while half sent")
	}
	copy(y, bytes.Repeat([]byte{'B'}, len(y))) // the caller's buffer again
	close(resume2)
	for range 2 {
		select {
		case err := <-others:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("W1 or X: %v, want the connection closed under it", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("the connection was not ended when Y was given up on")
			conn.Close()
		}
	}
	select {
	case data := <-got:
		if i := bytes.IndexByte(data, 'B'); i >= 0 {
			t.Fatalf("the server got the caller's buffer as overwritten after WriteAt returned, at byte %d of %d", i, len(data))
		}
		// Y was broken off, not sent whole after its caller had given up on it.
		if n := bytes.Count(data, []byte{'C'}); n >= len(y) {
			t.Fatalf("the server got all of Y (%d bytes) after WriteAt gave up on it", n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the connection was not closed")
	}
}
