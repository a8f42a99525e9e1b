package fdstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/testenv/require"
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

// dialEnv makes the test binary a client of another process: it sends the request reqEnv
// names (LIST if none) as its first datagram to the socket dialEnv names, prints the answer
// and exits.
const (
	dialEnv = "CRDIPC_FDSTORE_DIAL"
	reqEnv  = "CRDIPC_FDSTORE_REQUEST"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(dialEnv); path != "" {
		req := os.Getenv(reqEnv)
		if req == "" {
			req = "LIST"
		}
		fmt.Println(rawRequest(path, req))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// rawRequest sends req as the first datagram on a new connection and returns the answer,
// or what failed.
func rawRequest(path, req string) string {
	c, err := net.Dial("unixpacket", path)
	if err != nil {
		return "DIAL " + err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(req)); err != nil {
		return "WRITE " + err.Error()
	}
	b := make([]byte, 4096)
	n, err := c.Read(b)
	if err != nil {
		return "READ " + err.Error()
	}
	return string(b[:n])
}

// TestRefusesClientsWithoutTheToken: a connection that does not first present the token of
// the socket's directory gets nothing — not from this process, not from another one — and
// a refused connection is closed.
func TestRefusesClientsWithoutTheToken(t *testing.T) {
	s, c := startStore(t)
	if err := c.Put("vol-a", pipeWith(t, "secret")); err != nil {
		t.Fatal(err)
	}
	for _, req := range []string{"LIST", "GET vol-a", "AUTH", "AUTH not-the-token"} {
		if got := rawRequest(c.Path, req); !strings.HasPrefix(got, "ERR refused") {
			t.Errorf("%q without the token: answered %q, want ERR refused", req, got)
		}
	}
	// Refused and closed: a request after the refusal finds no one.
	conn, err := net.Dial("unixpacket", c.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 4096)
	if _, err := conn.Write([]byte("AUTH wrong")); err != nil {
		t.Fatal(err)
	}
	if n, _ := conn.Read(b); !strings.HasPrefix(string(b[:n]), "ERR refused") {
		t.Fatalf("wrong token: %q", b[:n])
	}
	_, _ = conn.Write([]byte("LIST"))
	if n, err := conn.Read(b); err == nil && n > 0 {
		t.Fatalf("a refused connection answered %q", b[:n])
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), dialEnv+"="+c.Path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client process: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "ERR refused") {
		t.Fatalf("another process without the token: answered %q, want ERR refused", out)
	}
	if names := s.Names(); !slices.Equal(names, []string{"vol-a"}) {
		t.Fatalf("store holds %v", names)
	}
}

// TestRefusesOtherUsers: a process of another user is refused even when it can reach the
// socket and read the token (SO_PEERCRED), and by default cannot even reach it (0700).
func TestRefusesOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		// CI runs as root (it mounts, as the data path's tests do): there this must not skip.
		require.Capable(t, "CRDIPC_REQUIRE_MOUNT", errors.New("needs root to run a client as another user"))
	}
	// A directory another user may enter, holding the store and a copy of this binary.
	dir, err := os.MkdirTemp("", "fdstore")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "client")
	if b, err := os.ReadFile(os.Args[0]); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "store", "fd.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	s := New(slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done; s.Close() })

	asNobody := func(req string) string {
		t.Helper()
		cmd := exec.Command(bin, "-test.run=^$")
		cmd.Env = append(os.Environ(), dialEnv+"="+path, reqEnv+"="+req)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("client process: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket directory: %v, %v; want 0700", fi.Mode(), err)
	}
	if got := asNobody("LIST"); !strings.Contains(got, "permission denied") {
		t.Fatalf("another user, socket directory 0700: %q, want permission denied", got)
	}
	// Opened up, token and all: SO_PEERCRED still refuses.
	token, err := os.ReadFile(filepath.Join(filepath.Dir(path), TokenFile))
	if err != nil {
		t.Fatal(err)
	}
	for p, mode := range map[string]os.FileMode{filepath.Dir(path): 0o755, path: 0o777} {
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	if got := asNobody("AUTH " + string(token)); !strings.HasPrefix(got, "ERR refused") || !strings.Contains(got, "uid 65534") {
		t.Fatalf("another user with the token: %q, want ERR refused for its uid", got)
	}
}

// TestListenNarrowsTheDirectory: a socket directory that exists with wider permissions (a
// hostPath is created 0755) is made 0700, as the doc says.
func TestListenNarrowsTheDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "holder")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := Listen(filepath.Join(dir, "fd.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("socket directory after Listen: %v, %v; want 0700", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(dir, TokenFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v, %v; want 0600", fi.Mode(), err)
	}
}
