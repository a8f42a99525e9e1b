package localsock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/require"
)

// dialEnv makes the test binary a client: it dials the stream socket the variable names and
// prints the hello or the error.
const dialEnv = "LOCALSOCK_TEST_DIAL"

func TestMain(m *testing.M) {
	if path := os.Getenv(dialEnv); path != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, hello, err := Dial(ctx, path)
		if err != nil {
			fmt.Println("ERR", err)
			os.Exit(0)
		}
		c.Close()
		fmt.Println("OK", hello)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// serve admits every connection of l with hello, and reports each verdict.
func serve(t *testing.T, l *Listener, hello string) <-chan error {
	t.Helper()
	verdicts := make(chan error, 16)
	go func() {
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				return
			}
			verdicts <- Admit(c, l.Token, hello, 5*time.Second)
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return verdicts
}

// TestAdmitsWhoHoldsTheToken: a client of this user that reads the token beside the socket
// is admitted and told the listener's hello; one presenting another token is refused, and
// told why.
func TestAdmitsWhoHoldsTheToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dir", "s.sock")
	l, err := Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	verdicts := serve(t, l, "node-a")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, hello, err := Dial(ctx, path)
	if err != nil || hello != "node-a" {
		t.Fatalf("Dial: %q, %v", hello, err)
	}
	c.Close()
	if err := <-verdicts; err != nil {
		t.Fatalf("Admit refused the token holder: %v", err)
	}
	if err := os.WriteFile(filepath.Join(filepath.Dir(path), TokenFile), []byte("not-it"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Dial(ctx, path); err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "token") {
		t.Fatalf("Dial with a wrong token: %v, want refused for the token", err)
	}
	if err := <-verdicts; err == nil {
		t.Fatal("Admit admitted a wrong token")
	}
}

// TestListenNarrowsTheDirectoryAndReplacesAStaleSocket: a directory made 0755 by someone else
// (a hostPath) is made 0700, the token file is 0600 and new on each Listen, and the socket file
// an earlier process left behind is replaced.
func TestListenNarrowsTheDirectoryAndReplacesAStaleSocket(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "local")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "s.sock")
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close() // a socket file nobody listens on, as after a crash
	l, err := Listen("unix", path)
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
	if token, err := Token(path); err != nil || token != l.Token || len(token) != 64 {
		t.Fatalf("token beside the socket: %q, %v; listener's %q", token, err, l.Token)
	}
	if _, err := Listen("unix", filepath.Join(dir, strings.Repeat("x", 120))); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("a path too long for a socket: %v", err)
	}
}

// TestRefusesOtherUsers: a process of another user is refused even when it can reach the
// socket and read the token (SO_PEERCRED).
func TestRefusesOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		// CI runs as root (it mounts, as the data path's tests do): there this must not skip.
		require.Capable(t, "CRDIPC_REQUIRE_MOUNT", errors.New("needs root to run a client as another user"))
	}
	dir, err := os.MkdirTemp("", "localsock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "client")
	if b, err := os.ReadFile(os.Args[0]); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "local", "s.sock")
	l, err := Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	verdicts := serve(t, l, "node-a")
	// Opened up, token and all: only SO_PEERCRED stands between.
	for p, mode := range map[string]os.FileMode{dir: 0o755, filepath.Dir(path): 0o755, path: 0o777, filepath.Join(filepath.Dir(path), TokenFile): 0o644} {
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), dialEnv+"="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client process: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); !strings.HasPrefix(got, "ERR") || !strings.Contains(got, "uid 65534") {
		t.Fatalf("another user with the token: %q, want refused for its uid", got)
	}
	if err := <-verdicts; err == nil || !strings.Contains(err.Error(), "uid 65534") {
		t.Fatalf("Admit's verdict on another user: %v", err)
	}
}
