package unixsocket

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// A successor binds its socket where its predecessor's was; the predecessor's Close must
// leave it, and the successor's own Close remove it.
func TestCloseLeavesASuccessorsSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	old, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	successor, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	if old.Current() {
		t.Error("the predecessor's listener calls the successor's socket its own")
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	accepted := make(chan error, 1)
	go func() {
		c, err := successor.Accept()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dialing the successor's socket after the predecessor closed: %v", err)
	}
	c.Close()
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}
	if !successor.Current() {
		t.Error("the successor's socket is not its own")
	}
	if err := successor.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("the socket after its own listener closed: %v, want it removed", err)
	}
}

// Remove takes the file away (a watcher sees the socket go) while the listener still
// serves the connections made.
func TestRemoveKeepsTheListener(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := l.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("the socket after Remove: %v, want it removed", err)
	}
	if l.Current() {
		t.Error("Current after Remove")
	}
	a, err := l.Accept()
	if err != nil {
		t.Fatalf("accepting a connection made before Remove: %v", err)
	}
	a.Close()
}
