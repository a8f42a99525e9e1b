package driver

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

// A successor binds its socket where its predecessor's was; the predecessor's Close must
// leave it.
func TestOwnedListenerLeavesASuccessorsSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	old, err := listenOwned(path)
	if err != nil {
		t.Fatal(err)
	}
	successor, err := listenOwned(path)
	if err != nil {
		t.Fatal(err)
	}
	old.Close()
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
	successor.Close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("the socket after its own listener closed: %v, want it removed", err)
	}
}

// The release is answered only once the volumes are released, also when the request
// arrives while the process is already stopping.
func TestHandoverAnswersOnceReleased(t *testing.T) {
	for _, stopping := range []bool{false, true} {
		t.Run(fmt.Sprintf("stopping=%v", stopping), func(t *testing.T) {
			d := &Driver{log: logr.Discard(), o: Options{HandoverDir: t.TempDir()}}
			h, err := d.listenHandover()
			if err != nil {
				t.Fatal(err)
			}
			defer h.close()
			if stopping {
				h.leave()
			}
			answered := make(chan error, 1)
			go func() {
				answered <- askRelease(context.Background(), filepath.Join(d.o.HandoverDir, handoverSocketName))
			}()
			if !stopping {
				select {
				case <-h.asked():
				case <-time.After(10 * time.Second):
					t.Fatal("the request did not reach the serving loop")
				}
				h.leave()
			}
			select {
			case err := <-answered:
				t.Fatalf("answered before the release: %v", err)
			case <-time.After(50 * time.Millisecond):
			}
			h.done()
			select {
			case err := <-answered:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no answer after the release")
			}
		})
	}
}

func TestHandoverRefusesAnUnknownRequest(t *testing.T) {
	d := &Driver{log: logr.Discard(), o: Options{HandoverDir: t.TempDir()}}
	h, err := d.listenHandover()
	if err != nil {
		t.Fatal(err)
	}
	defer h.close()
	c, err := net.Dial("unix", filepath.Join(d.o.HandoverDir, handoverSocketName))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintln(c, "give me everything")
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.Contains(line, "unknown request") {
		t.Errorf("answer %q, %v; want an unknown request", line, err)
	}
}

// Only one process holds the serving lock; the kernel drops it with its holder.
func TestServingLockIsExclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), servingLockName)
	open := func() *os.File {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	a, b := open(), open()
	defer b.Close()
	if ok, err := tryLock(a); !ok || err != nil {
		t.Fatalf("first lock: %v, %v", ok, err)
	}
	if ok, err := tryLock(b); ok || err != nil {
		t.Fatalf("second lock while the first is held: %v, %v; want refused", ok, err)
	}
	a.Close()
	if ok, err := tryLock(b); !ok || err != nil {
		t.Fatalf("second lock once the first holder closed it: %v, %v", ok, err)
	}
}
