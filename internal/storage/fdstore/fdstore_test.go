package fdstore

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func startStore(t *testing.T) (*Store, Client) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fd.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	s := New(slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		s.Close()
	})
	return s, Client{Path: path}
}

// pipeWith returns the read end of a pipe that holds msg, and closes the write end: what
// the store gives back must be the same open file, whose data is there to read.
func pipeWith(t *testing.T, msg string) int {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(p[1], []byte(msg)); err != nil {
		t.Fatal(err)
	}
	unix.Close(p[1])
	return p[0]
}

func readAll(t *testing.T, fd int) string {
	t.Helper()
	f := os.NewFile(uintptr(fd), "got")
	defer f.Close()
	b := make([]byte, 64)
	n, _ := f.Read(b)
	return string(b[:n])
}

func TestPutGetDeleteList(t *testing.T) {
	s, c := startStore(t)
	fd := pipeWith(t, "first")
	if err := c.Put("vol-a", fd); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd) // the store has its own
	if err := c.Put("vol-b", pipeWith(t, "second")); err != nil {
		t.Fatal(err)
	}
	names, err := c.List()
	if err != nil || !slices.Equal(names, []string{"vol-a", "vol-b"}) {
		t.Fatalf("list: %v, %v", names, err)
	}
	got, err := c.Get("vol-a")
	if err != nil {
		t.Fatal(err)
	}
	if s := readAll(t, got); s != "first" {
		t.Fatalf("vol-a holds %q, want the pipe that held %q", s, "first")
	}
	// A PUT replaces.
	if err := c.Put("vol-b", pipeWith(t, "third")); err != nil {
		t.Fatal(err)
	}
	got, err = c.Get("vol-b")
	if err != nil || readAll(t, got) != "third" {
		t.Fatalf("vol-b after a second put: %v", err)
	}
	if err := c.Delete("vol-a"); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete("vol-a"); err != nil {
		t.Fatalf("deleting twice: %v", err)
	}
	if _, err := c.Get("vol-a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get after delete: %v, want ErrNotFound", err)
	}
	if names := s.Names(); !slices.Equal(names, []string{"vol-b"}) {
		t.Fatalf("store holds %v", names)
	}
}

func TestBadRequests(t *testing.T) {
	_, c := startStore(t)
	for _, name := range []string{"", "a b", "line\nbreak", strings.Repeat("x", 513)} {
		if err := c.Put(name, pipeWith(t, "x")); err == nil || !strings.Contains(err.Error(), "name") {
			t.Errorf("put %q: %v, want a name error", name, err)
		}
	}
	if _, _, err := c.do("FROB x", -1); err == nil || !strings.Contains(err.Error(), "unknown request") {
		t.Errorf("unknown verb: %v", err)
	}
	if _, _, err := c.do("PUT x", -1); err == nil || !strings.Contains(err.Error(), "one descriptor") {
		t.Errorf("put without a descriptor: %v", err)
	}
	if _, err := (Client{Path: filepath.Join(t.TempDir(), "none.sock")}).List(); err == nil {
		t.Error("list at a socket nobody serves: no error")
	}
}
