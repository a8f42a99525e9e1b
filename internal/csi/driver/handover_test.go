package driver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/storage/fdstore"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

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

// TestSurgeLeavesTheServingSocket: a successor started while another process serves the
// node (a surge pod) binds the CSI socket only once it holds the node's volumes. While it
// waits (here for a data-path certificate that never comes), the kubelet's calls reach
// the serving process; and once it gives up (a crash loop), the socket is still that one's.
func TestSurgeLeavesTheServingSocket(t *testing.T) {
	dir := t.TempDir()
	holderSock := filepath.Join(dir, "holder", "fd.sock")
	hl, err := fdstore.Listen(holderSock)
	if err != nil {
		t.Fatal(err)
	}
	holder := fdstore.New(slog.New(slog.DiscardHandler))
	hctx, stopHolder := context.WithCancel(context.Background())
	t.Cleanup(stopHolder)
	go func() { _ = holder.Serve(hctx, hl) }()
	endpoint := "unix://" + filepath.Join(dir, "plugin", "csi.sock")
	log := logr.Discard()
	newDriver := func(dataConfig func() (*rest.Config, error)) *Driver {
		d, err := New(Options{
			Client: fake.NewClientBuilder().WithScheme(scheme.Scheme).Build(), Registerer: prometheus.NewRegistry(), Logger: &log,
			NodeID: "node-1", FDHolder: holderSock, HandoverDir: filepath.Join(dir, "plugin"), TargetDir: filepath.Join(dir, "targets"),
			DataConfig: dataConfig,
		})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// serve serves d until cancel, then stop waits for it; stop cancels too.
	serve := func(d *Driver) (cancel, stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		served := make(chan error, 1)
		go func() { served <- d.Serve(ctx, endpoint) }()
		var once sync.Once
		stop = func() {
			once.Do(func() {
				cancel()
				if err := <-served; err != nil {
					t.Errorf("serve: %v", err)
				}
			})
		}
		t.Cleanup(stop)
		return cancel, stop
	}

	serving := newDriver(nil)
	serve(serving)
	select {
	case <-serving.Serving():
	case <-time.After(time.Minute):
		t.Fatal("the first process does not serve")
	}
	never := make(chan struct{})
	successor := newDriver(func() (*rest.Config, error) {
		<-never
		return nil, errors.New("no certificate")
	})
	cancelSuccessor, stopSuccessor := serve(successor)
	var unblock sync.Once
	giveUp := func() { cancelSuccessor(); unblock.Do(func() { close(never) }) }
	t.Cleanup(giveUp) // before stopSuccessor's
	wait.Eventually(t, time.Minute, "the successor getting ready", func(context.Context) (bool, error) {
		return successor.preparing.Load(), nil
	})
	answers := func(when string) {
		t.Helper()
		conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}); err != nil {
			t.Fatalf("%s: the CSI socket does not answer: %v", when, err)
		}
	}
	answers("while a successor waits for its turn")
	giveUp()
	stopSuccessor()
	answers("after the successor gave up")
}
