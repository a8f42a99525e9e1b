package driver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/unixsocket"
)

// A rollout of the node plugin starts the new pod before the old one stops (the DaemonSet's
// maxSurge). The two processes of one node agree through HandoverDir:
//
//   - serving.lock: the process that serves the node's volumes holds an exclusive flock on
//     it. The kernel drops the lock when that process dies, however it dies, so a successor
//     never serves a connection its predecessor still serves.
//   - handover.sock: where the lock holder listens for a successor. A successor that finds
//     the lock taken first gets what it can ready without the volumes (the data-path
//     certificate), then asks; the holder stops serving CSI, answers what it has read,
//     closes its replica sessions cleanly, unlocks and says so. The successor takes the
//     lock and every volume over from the fd holder (recoverTargets). The volumes' I/O
//     pauses only for the release and the takeover, not for a pod start.
//
// A predecessor that does not answer (a version without this socket, or one not yet
// serving) is asked again until the lock comes free, as it does when that process exits.
// One that is hung (stopped, deadlocked) is not taken over by force: it may have read
// requests it would still answer, and its engine holds the replicas' writer sessions, if it
// ever ran again. It is ended instead, by its liveness probe (config/csi/node.yaml); the
// kernel frees the lock with it, and the holder keeps its connections meanwhile.

const (
	servingLockName    = "serving.lock"
	handoverSocketName = "handover.sock"

	// handoverRequest and handoverReply are the whole protocol, one line each way.
	handoverRequest = "release"
	handoverReply   = "released"
)

// askEvery is how often a successor tries the lock and asks again.
const askEvery = 50 * time.Millisecond

// releaseSlow is how long a release may take before a successor says it waits: one
// normally takes about a second, a Node call in flight up to 30 s more (awaitNodeOps).
const releaseSlow = 35 * time.Second

// HandedOver reports whether this process gave its volumes to a successor: it serves
// nothing more, and waits to be stopped.
func (d *Driver) HandedOver() bool { return d.handedOver.Load() }

// takeTurn returns the serving lock of this node's volumes once this process holds it,
// asking a live predecessor to hand them over. It returns nil without HandoverDir.
func (d *Driver) takeTurn(ctx context.Context) (*os.File, error) {
	dir := d.o.HandoverDir
	if dir == "" {
		return nil, nil
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("csi driver: the handover directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, servingLockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("csi driver: the serving lock: %w", err)
	}
	locked, err := tryLock(f)
	if err != nil || locked {
		if err != nil {
			f.Close()
			return nil, err
		}
		return f, nil
	}
	start := time.Now()
	d.log.Info("another process of this driver serves this node's volumes; getting ready to take them over", "handover", filepath.Join(dir, handoverSocketName))
	// The certificate may take a CSR approval: the predecessor serves meanwhile, and this
	// pod is not ready, so that a rollout does not stop the predecessor before.
	d.preparing.Store(true)
	_, err = d.dataTLS(ctx)
	d.preparing.Store(false)
	if err != nil {
		f.Close()
		return nil, err
	}
	ready := time.Now()
	asked := false
	var lastErr error
	for {
		if locked, err := tryLock(f); err != nil {
			f.Close()
			return nil, err
		} else if locked {
			d.log.Info("the node's volumes are this process's to serve", "ready after", ready.Sub(start), "released after", time.Since(ready))
			return f, nil
		}
		if !asked {
			// A stopped or hung predecessor takes the request (the kernel queues the
			// connection) and never answers; it holds the lock until it dies, and the node
			// plugin's liveness probe sees to that (config/csi/node.yaml). The request is
			// answered with EOF then, and the lock is free.
			slow := time.AfterFunc(releaseSlow, func() {
				d.log.Info("the serving process has not released the node's volumes yet (hung or stopped?); waiting for it to release them or to die", "after", releaseSlow)
			})
			err := askRelease(ctx, filepath.Join(dir, handoverSocketName))
			slow.Stop()
			if err != nil {
				if lastErr == nil || err.Error() != lastErr.Error() {
					d.log.Info("the serving process does not hand over (yet); waiting for it to stop", "reason", err.Error())
				}
				lastErr = err
			} else {
				asked = true
				continue
			}
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(askEvery):
		}
	}
}

// tryLock takes f's exclusive flock without waiting.
func tryLock(f *os.File) (bool, error) {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, unix.EWOULDBLOCK):
			return false, nil
		case errors.Is(err, unix.EINTR):
			continue
		}
		return false, fmt.Errorf("csi driver: locking %s: %w", f.Name(), err)
	}
}

// askRelease asks the process serving on socket to release the node's volumes and waits
// until it has.
func askRelease(ctx context.Context, socket string) error {
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unix", socket)
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	if _, err := fmt.Fprintln(c, handoverRequest); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("waiting for the release: %w", err)
	}
	if got := strings.TrimSpace(line); got != handoverReply {
		return fmt.Errorf("the serving process answered %q", got)
	}
	return nil
}

// handover is the lock holder's side: a successor's request reaches the serving loop on
// asks; the answer is written once released is closed, whatever ended the serving (a
// request, or this process stopping).
type handover struct {
	l        net.Listener
	asks     chan struct{}
	leaving  chan struct{}
	released chan struct{}
}

func (d *Driver) listenHandover() (*handover, error) {
	if d.o.HandoverDir == "" {
		return nil, nil
	}
	if err := os.MkdirAll(d.o.HandoverDir, 0o750); err != nil {
		return nil, fmt.Errorf("csi driver: the handover directory: %w", err)
	}
	l, err := unixsocket.Listen(filepath.Join(d.o.HandoverDir, handoverSocketName))
	if err != nil {
		return nil, fmt.Errorf("csi driver: the handover socket: %w", err)
	}
	h := &handover{l: l, asks: make(chan struct{}), leaving: make(chan struct{}), released: make(chan struct{})}
	go h.serve(d)
	return h, nil
}

func (h *handover) serve(d *Driver) {
	for {
		c, err := h.l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return
			}
			if req := strings.TrimSpace(line); req != handoverRequest {
				fmt.Fprintf(c, "unknown request %q\n", req)
				return
			}
			c.SetReadDeadline(time.Time{})
			select {
			case h.asks <- struct{}{}:
				d.log.Info("a successor asks for this node's volumes: handing them over")
			case <-h.leaving:
			}
			<-h.released
			fmt.Fprintln(c, handoverReply)
		}()
	}
}

// asked is where a successor's request arrives; nil (never) without a handover socket.
func (h *handover) asked() <-chan struct{} {
	if h == nil {
		return nil
	}
	return h.asks
}

func (h *handover) leave() {
	if h != nil {
		close(h.leaving)
	}
}

func (h *handover) done() {
	if h != nil {
		close(h.released)
	}
}

func (h *handover) close() {
	if h != nil {
		h.l.Close()
	}
}
