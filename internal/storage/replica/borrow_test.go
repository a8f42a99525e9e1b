package replica

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// A large write is sent from the caller's buffer, not a copy of it; once WriteAt has
// returned, whatever its outcome, not one byte of that buffer may reach the server. The
// dangerous schedule: the write is given up on (its context ends) while its bytes are being
// sent, in a batch whose connection deadline is none because another frame of the batch has
// none. WriteAt must then end the connection (the frame is broken off) before it returns,
// rather than leave the writer sending from a buffer the caller is about to overwrite.
func TestWriteGivenUpOnWhileBeingSentSendsNothingAfterwards(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	conn := newConn("pipe", a)
	defer conn.Close()
	r := conn.Replica("ns/r")

	// The server: reads 4 KiB every 2 ms, answers nothing, keeps what it got.
	got := make(chan []byte, 1)
	var read atomic.Int64
	go func() {
		var all bytes.Buffer
		buf := make([]byte, 4<<10)
		for {
			n, err := b.Read(buf)
			all.Write(buf[:n])
			read.Add(int64(n))
			if err != nil {
				got <- all.Bytes()
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	poll := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10 s", what)
			}
		}
	}
	queued := func() int {
		conn.w.mu.Lock()
		defer conn.w.mu.Unlock()
		return len(conn.w.queue)
	}

	// W1 (256 KiB, no deadline) holds the connection for about 128 ms; X (4 KiB, no
	// deadline) and Y (1 MiB, 300 ms) queue behind it and then go as one batch with no
	// connection deadline. Y takes about 512 ms to send: it is given up on half sent.
	others := make(chan error, 2)
	go func() { others <- r.WriteAt(context.Background(), bytes.Repeat([]byte{'A'}, 256<<10), 0, 1) }()
	poll("W1 sent", func() bool { return read.Load() > 0 })
	go func() { others <- r.WriteAt(context.Background(), bytes.Repeat([]byte{'X'}, 4<<10), 1<<20, 2) }()
	poll("X queued", func() bool { return queued() == 1 })
	y := bytes.Repeat([]byte{'C'}, 1<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := r.WriteAt(ctx, y, 2<<20, 3); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Y: %v, want its deadline exceeded", err)
	}
	copy(y, bytes.Repeat([]byte{'B'}, len(y))) // the caller's buffer again
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
