package blockdev

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Adopt serves an export that another process set up and no longer serves: the FUSE mount
// at dir, loop (/dev/loopN, Exported.Device of the predecessor) bound to its file, and conn,
// a descriptor of that mount's FUSE connection (from Exported.Conn in the predecessor, kept by a process that outlived
// it). The kernel kept every request of the connection queued meanwhile; Adopt asks it to
// resend those the predecessor had read but not answered (Linux 6.9+), so a process killed
// in the middle of a write loses nothing: the file system above only paused.
//
// Adopt owns conn from the call on: it closes it on failure, and the returned export
// serves it until Close or Release. dev must hold what the predecessor's Device held.
// Nothing of the predecessor's process is needed: the kernel's node IDs and file handles
// mean the same to every server (server).
func Adopt(ctx context.Context, dev Device, dir, loop string, conn int, o Options) (*Exported, error) {
	fail := func(err error) (*Exported, error) {
		unix.Close(conn)
		return nil, fmt.Errorf("adopt export at %s: %w", dir, err)
	}
	if err := Available(); err != nil {
		return fail(err)
	}
	o = o.withDefaults()
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fail(err)
	}
	backing, err := exported(abs, loop)
	if err != nil {
		return fail(err)
	}
	file := filepath.Join(abs, VolumeName)
	var st unix.Stat_t
	if err := unix.Fstat(conn, &st); err != nil {
		return fail(fmt.Errorf("stat the connection's descriptor: %w", err))
	} else if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return fail(errors.New("the connection's descriptor is not /dev/fuse"))
	}
	if err := ConnAlive(conn); err != nil {
		return fail(err)
	}
	if err := unix.SetNonblock(conn, true); err != nil {
		return fail(fmt.Errorf("set the connection non-blocking: %w", err))
	}
	unix.CloseOnExec(conn)

	e := &Exported{dir: abs, file: file, loop: loop, backing: backing, opts: o}
	e.directIO = loopDirectIO(e.loop)
	e.vol = newVolume(dev, o.Logger)
	if e.srv, err = newServer(conn, e.vol, o); err != nil {
		return fail(err)
	}
	e.served = e.srv.done
	// The resend before any reader runs: it moves every request read and not answered on
	// the connection back to the queue, and would move one of this server's readers' too,
	// which would then run twice (the first answer, to a unique the resend renamed, lost).
	if err := e.srv.resend(); err != nil {
		// Before 6.9 there is no RESEND: only requests read by the predecessor stay unanswered.
		o.Logger.Warn("FUSE_NOTIFY_RESEND refused (Linux older than 6.9?); requests a dead server had read stay unanswered", "dir", abs, "err", err)
	}
	// The kernel caches the file's size forever; the Device may have grown since (a Resize
	// the predecessor did not finish).
	if err := e.srv.invalidateAttrs(); err != nil && !errors.Is(err, unix.ENOENT) {
		o.Logger.Warn("invalidating the file's cached attributes", "dir", abs, "err", err)
	}
	e.srv.start()
	o.Logger.Info("block device export adopted", "dir", abs, "device", e.loop, "directIO", e.directIO, "size", dev.Size())
	select {
	case <-ctx.Done():
		return nil, errors.Join(fmt.Errorf("adopt export at %s: %w", abs, ctx.Err()), e.Release())
	default:
	}
	return e, nil
}

// ErrNoExport is wrapped by Exists and Adopt when dir holds no export to adopt.
var ErrNoExport = errors.New("no export to adopt")

// Exists says whether dir holds an export that Adopt could serve — an export's FUSE mount,
// and loop bound to a file of it: nil, or an error wrapping ErrNoExport. It reads only the
// mount table and sysfs, which answer while no server does.
func Exists(dir, loop string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	_, err = exported(abs, loop)
	return err
}

// exported checks that dir holds an export whose loop device is loop, and returns the
// loop's backing file as sysfs names it. That is dir/VolumeName while the mount the loop
// was bound through is attached; a mount namespace that has gone since (the container of a
// predecessor) leaves it detached, and sysfs then names the file from the root of that
// mount: /VolumeName. Nothing else would tell which loop device is whose: statting the
// file, or LOOP_GET_STATUS on the device, waits for a server to answer. /VolumeName is
// therefore taken only while no loop device is bound to dir/VolumeName itself: one that
// is, is dir's, and a detached one belongs to some other export (an earlier staging of the
// volume, or another volume's export left by a gone container). The caller tells the rest
// apart by the connection it is to adopt (whether it is alive).
func exported(dir, loop string) (string, error) {
	ms, err := mountsAt(dir)
	if err != nil {
		return "", err
	}
	if len(ms) == 0 || ms[len(ms)-1].fsType != fuseType {
		return "", fmt.Errorf("%w: no %s mount at %s", ErrNoExport, fuseType, dir)
	}
	file := filepath.Join(dir, VolumeName)
	bf, ok := loopBackingFile(filepath.Base(loop))
	if !ok || !strings.HasPrefix(loop, "/dev/loop") {
		return "", fmt.Errorf("%w: %s is not a bound loop device", ErrNoExport, loop)
	}
	if bf != file && bf != "/"+VolumeName {
		return "", fmt.Errorf("%w: %s is bound to %s, not to %s", ErrNoExport, loop, bf, file)
	}
	if bf != file {
		if own := loopsBackedBy(func(_, b string) bool { return b == file }); len(own) > 0 {
			return "", fmt.Errorf("%w: %s is bound to a detached %s, and /dev/%s to %s", ErrNoExport, loop, bf, own[0], file)
		}
	}
	return bf, nil
}

// Conn returns a new descriptor of the export's FUSE connection, for a process that keeps
// it open for the next server (Adopt): while any process holds one, the kernel keeps the
// connection, and with it the mounts and the loop device, through this process's death.
// The caller owns it. It is a raw descriptor on purpose: os.File.Fd would make the shared
// open file description blocking.
func (e *Exported) Conn() (int, error) {
	if e.srv == nil {
		return -1, fmt.Errorf("export at %s: not served", e.dir)
	}
	return e.srv.dup()
}

// Release stops serving without tearing anything down, for a successor to Adopt: it stops
// reading requests, answers those it has read, and closes this process's descriptor. The
// mounts and the loop device stay; requests that arrive meanwhile wait in the kernel. Some
// other process must hold a descriptor of the connection (Conn), or closing this one ends
// it and the loop device fails I/O. After Release, Close does nothing.
func (e *Exported) Release() error {
	e.closeOnce.Do(func() {
		if e.srv == nil {
			return
		}
		e.srv.stop()
		<-e.srv.done
		e.opts.Logger.Info("block device export released for a successor", "dir", e.dir, "device", e.loop)
	})
	return e.closeErr
}

// ConnAlive says whether conn is a descriptor of a FUSE connection that a successor could
// serve: nil, or an error wrapping ErrNoExport when the connection has ended (unmounted
// everywhere, or aborted) or the descriptor was never mounted. The kernel tells without a
// server: polling such a descriptor reports an error. A holder may keep descriptors of
// ended connections (a forget that failed), and one of them must not be taken for the
// volume's live connection.
func ConnAlive(conn int) error {
	fds := []unix.PollFd{{Fd: int32(conn), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll the FUSE connection: %w", err)
		}
		if fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
			return fmt.Errorf("%w: the FUSE connection has ended", ErrNoExport)
		}
		return nil
	}
}
