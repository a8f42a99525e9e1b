package blockdev

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Available reports whether this host can export: nil, or an error wrapping ErrUnavailable
// that names everything missing.
func Available() error {
	var missing []string
	if fi, err := os.Stat("/dev/fuse"); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		missing = append(missing, "/dev/fuse (the FUSE device)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		missing = append(missing, "/dev/loop-control (the loop driver)")
	}
	if ok, why := hasSysAdmin(); !ok {
		missing = append(missing, "CAP_SYS_ADMIN (mounting and losetup need root): "+why)
	}
	if _, err := exec.LookPath("losetup"); err != nil {
		missing = append(missing, "the losetup binary (util-linux)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: missing %s", ErrUnavailable, strings.Join(missing, "; "))
	}
	return nil
}

// hasSysAdmin reads the effective capability set rather than checking for uid 0: root in a
// container without CAP_SYS_ADMIN can neither mount nor configure loop devices.
func hasSysAdmin() (bool, string) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false, err.Error()
	}
	for line := range strings.Lines(string(b)) {
		hex, ok := strings.CutPrefix(line, "CapEff:")
		if !ok {
			continue
		}
		caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		if err != nil {
			return false, fmt.Sprintf("parse CapEff %q: %v", strings.TrimSpace(hex), err)
		}
		if caps&(1<<unix.CAP_SYS_ADMIN) == 0 {
			return false, fmt.Sprintf("not in the effective set (uid %d)", os.Getuid())
		}
		return true, ""
	}
	return false, "no CapEff line in /proc/self/status"
}

// Exported is a Device served as a FUSE file and attached to a loop device.
type Exported struct {
	dir, file string
	loop      string // /dev/loopN, empty until attached
	backing   string // the loop's backing file as sysfs names it (see exported)
	directIO  bool
	opts      Options
	srv       *server
	served    chan struct{} // closed when the FUSE server has stopped
	vol       *volume       // the served file

	resizeMu sync.Mutex // serializes Resize

	closeOnce sync.Once
	closeErr  error
}

// Export mounts a FUSE file system at dir (created if missing) holding one file, VolumeName,
// of dev.Size() bytes, and attaches a loop device to it. ctx bounds only the setup; the
// export lives until Close. dev.Size() must be a positive multiple of 512 (the loop driver
// ignores a partial last sector). dir must not be a mount point already: a stale export left
// by a crashed process has to go first (Cleanup).
//
// On failure nothing is left mounted or attached.
func Export(ctx context.Context, dev Device, dir string, o Options) (*Exported, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	o = o.withDefaults()
	size := dev.Size()
	if size <= 0 || size%512 != 0 {
		return nil, fmt.Errorf("export device of %d bytes: size must be a positive multiple of 512", size)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("export at %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("export at %s: %w", abs, err)
	}
	if ms, err := mountsAt(abs); err != nil {
		return nil, fmt.Errorf("export at %s: %w", abs, err)
	} else if len(ms) > 0 {
		return nil, fmt.Errorf("export at %s: already a mount point (%s); a stale export must be removed with Cleanup first", abs, ms[len(ms)-1].fsType)
	}

	e := &Exported{dir: abs, file: filepath.Join(abs, VolumeName), opts: o}
	if err := e.mount(ctx, dev); err != nil {
		return nil, fmt.Errorf("export at %s: %w", abs, err)
	}
	e.backing = e.file
	e.loop, e.directIO, err = attachLoop(ctx, e.file, o.DirectIO)
	if err != nil {
		err = fmt.Errorf("export at %s: attach loop device: %w", abs, err)
		return nil, errors.Join(err, e.Close())
	}
	o.Logger.Info("block device exported", "dir", abs, "device", e.loop, "directIO", e.directIO, "size", size)
	return e, nil
}

func (e *Exported) mount(ctx context.Context, dev Device) error {
	fd, err := mountFUSE(e.dir)
	if err != nil {
		return err
	}
	e.vol = newVolume(dev, e.opts.Logger)
	e.srv, err = newServer(fd, e.vol, e.opts)
	if err != nil {
		unix.Close(fd)
		return errors.Join(err, unix.Unmount(e.dir, unix.MNT_DETACH))
	}
	e.served = e.srv.done
	e.srv.start()
	// The kernel sends FUSE_INIT as soon as the mount exists.
	select {
	case <-e.srv.inited:
		return nil
	case <-e.srv.done:
		return errors.Join(errors.New("mount fuse: the connection ended before FUSE_INIT"), e.Close())
	case <-ctx.Done():
		return errors.Join(fmt.Errorf("mount fuse: waiting for FUSE_INIT: %w", ctx.Err()), e.Close())
	}
}

// Resize grows the export to size bytes, a positive multiple of 512, while it is in use:
// the FUSE file takes the new size, the kernel's cached attributes of it are invalidated,
// and the loop device re-reads its capacity (LOOP_SET_CAPACITY), so that afterwards the
// loop device is size bytes. The Device must already hold size bytes (for the volume
// engine: Grow first). A file system on the loop device is not touched: growing it is the
// caller's next step (resize2fs, xfs_growfs).
//
// Shrinking is refused. Resizing to the current size finishes what an interrupted Resize
// left undone (the loop device not re-sized yet) and is otherwise a no-op.
func (e *Exported) Resize(size int64) error {
	if size <= 0 || size%512 != 0 {
		return fmt.Errorf("resize export at %s to %d bytes: size must be a positive multiple of 512", e.dir, size)
	}
	e.resizeMu.Lock()
	defer e.resizeMu.Unlock()
	if e.vol == nil || e.loop == "" {
		return fmt.Errorf("resize export at %s: not exported", e.dir)
	}
	select {
	case <-e.served:
		return fmt.Errorf("resize export at %s: the FUSE server has stopped", e.dir)
	default:
	}
	if cur := e.vol.size.Load(); size < cur {
		return fmt.Errorf("resize export at %s: it is %d bytes; shrinking it to %d is not supported", e.dir, cur, size)
	}
	if have := e.vol.dev.Size(); have < size {
		return fmt.Errorf("resize export at %s to %d bytes: the device holds %d; grow it first", e.dir, size, have)
	}
	e.vol.size.Store(size)
	// The kernel caches the file's attributes (AttrTimeout): drop them (offset -1: the
	// attributes only, there is no page cache), then stat the file so that its inode takes
	// the new size before the loop driver reads it.
	if err := e.srv.invalidateAttrs(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("resize export at %s: invalidating the kernel's attributes of %s: %w", e.dir, e.file, err)
	}
	if fi, err := os.Stat(e.file); err != nil {
		return fmt.Errorf("resize export at %s: %w", e.dir, err)
	} else if fi.Size() != size {
		return fmt.Errorf("resize export at %s: the kernel still sees %s as %d bytes, want %d", e.dir, e.file, fi.Size(), size)
	}
	if err := loopSetCapacity(e.loop); err != nil {
		return fmt.Errorf("resize export at %s: %w", e.dir, err)
	}
	if got, err := loopSize(e.loop); err != nil {
		return fmt.Errorf("resize export at %s: %w", e.dir, err)
	} else if got != size {
		return fmt.Errorf("resize export at %s: loop device %s is %d bytes after re-reading its capacity, want %d", e.dir, e.loop, got, size)
	}
	e.opts.Logger.Info("block device export resized", "dir", e.dir, "device", e.loop, "size", size)
	return nil
}

// Device is the loop device, e.g. /dev/loop3.
func (e *Exported) Device() string { return e.loop }

// File is the FUSE file the loop device is bound to.
func (e *Exported) File() string { return e.file }

// DirectIO reports whether the loop driver does direct I/O on the file (read back from
// sysfs after attaching, so it is what the kernel does, not what was asked for).
func (e *Exported) DirectIO() bool { return e.directIO }

// Done is closed when the FUSE server has stopped serving. Until then the Device may be
// called; after a Close that returned ErrBusy, that is later than Close.
func (e *Exported) Done() <-chan struct{} { return e.served }

// Close detaches the loop device and unmounts the FUSE file system. It is idempotent (later
// calls return the first call's result) and safe on a partially set up export.
//
// The file system mounted on the loop device must be unmounted first. If the loop device is
// still open at Options.CloseTimeout, the FUSE mount is detached lazily and keeps serving the
// Device until the last user lets go; Close then returns an error wrapping ErrBusy, and Done
// tells when the Device is no longer called.
//
// Once the FUSE mount is unmounted cleanly, Close ends its connection (fusectl's abort), as
// the kernel does when the last mount of it goes: a copy of the mount in another mount
// namespace (a process that unshared its mounts meanwhile) would otherwise keep it, and the
// server, alive for as long as that process lives.
func (e *Exported) Close() error {
	e.closeOnce.Do(func() { e.closeErr = e.close(false) })
	return e.closeErr
}

// Terminate is Close for a caller that knows nothing may use the Device any more (the CSI
// node plugin's NodeUnstageVolume, after unmounting the staging path): a loop device still
// open at Options.CloseTimeout — a file system on it that lives on in another mount
// namespace's copy of the mount table — is flushed, the FUSE mount detached and its
// connection ended, so that those users get EIO and the server stops, instead of serving
// them until they let go. It returns once the server has stopped. After Close or Release it
// does nothing.
func (e *Exported) Terminate() error {
	e.closeOnce.Do(func() { e.closeErr = e.close(true) })
	return e.closeErr
}

func (e *Exported) close(force bool) error {
	deadline := time.Now().Add(e.opts.CloseTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.CloseTimeout)
	defer cancel()
	var errs []error
	released := true
	if e.loop != "" {
		name := filepath.Base(e.loop)
		if err := detachLoop(ctx, e.loop, e.backing); err != nil {
			errs = append(errs, fmt.Errorf("detach %s: %w", e.loop, err))
		}
		// losetup -d on an open device only marks it auto-clear; wait for the release.
		err := poll(deadline, func() (bool, error) {
			bf, ok := loopBackingFile(name)
			return !ok || bf != e.backing, nil
		})
		switch {
		case err == nil:
		case force:
			// Its last user is not ours to wait for. What was written through it reaches
			// the Device before the connection ends.
			released = false
			if err := flushLoop(e.loop, e.backing); err != nil {
				errs = append(errs, err)
			}
		default:
			released = false
			errs = append(errs, fmt.Errorf("%w: %s still open (is a file system still mounted on it?); it is detached when its last user closes it", ErrBusy, e.loop))
		}
	}
	if e.srv != nil {
		if err := e.unmount(deadline, released, force); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close export at %s: %w", e.dir, err)
	}
	e.opts.Logger.Info("block device export closed", "dir", e.dir, "device", e.loop)
	return nil
}

// flushLoop makes the Device hold what was written through loop while it is still bound to
// backing: fsync of a block device writes its cached blocks and sends the loop driver a
// flush, which becomes a FUSE FSYNC.
func flushLoop(loop, backing string) error {
	if bf, ok := loopBackingFile(filepath.Base(loop)); !ok || bf != backing {
		return nil // released meanwhile: the release flushed it
	}
	f, err := os.OpenFile(loop, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("flush %s: %w", loop, err)
	}
	defer f.Close()
	if bf, ok := loopBackingFile(filepath.Base(loop)); !ok || bf != backing {
		return nil // opened another user's loop device, or an unbound one
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("flush %s: %w", loop, err)
	}
	return nil
}

// unmount unmounts the FUSE file system, retrying while it is busy until the deadline, then
// lazily; then it ends the connection, which stops the server. A lazy unmount, unless force,
// leaves the connection and the server: whoever still holds the file (the loop driver) keeps
// working, and the kernel ends the connection when it lets go.
func (e *Exported) unmount(deadline time.Time, tryClean, force bool) error {
	// Held until the connection has been ended: while this clone of the mount exists, the
	// file system, and with it its device number (fusectl's name for the connection), is
	// ours; once the last mount goes the kernel may give that number to a new connection.
	pin, dev, perr := pinMount(e.dir)
	unpin := func() {
		if pin >= 0 {
			unix.Close(pin)
			pin = -1
		}
	}
	defer unpin()
	end := func() error {
		var aerr error
		if perr == nil {
			aerr = abortConnection(dev)
		} else {
			aerr = perr
		}
		// Without the pin, the kernel's own abort at the last unmount is all there is: a
		// copy in another namespace keeps the server running.
		unpin()
		if aerr != nil {
			e.opts.Logger.Warn("could not end the FUSE connection after unmounting it", "dir", e.dir, "err", aerr)
		}
		select {
		case <-e.served:
			return nil
		case <-time.After(time.Until(deadline) + 5*time.Second):
			// The serve loops see ENODEV right after the abort; the margin past the deadline
			// is so that a slow machine does not turn a clean close into an error.
			if aerr != nil {
				return fmt.Errorf("fuse server at %s did not stop after unmount: ending its connection: %w", e.dir, aerr)
			}
			return fmt.Errorf("fuse server at %s did not stop after unmount", e.dir)
		}
	}
	if tryClean {
		err := poll(deadline, func() (bool, error) {
			switch err := unix.Unmount(e.dir, 0); {
			case err == nil, errors.Is(err, unix.EINVAL): // EINVAL: no longer a mount point
				return true, nil
			case errors.Is(err, unix.EBUSY), errors.Is(err, unix.EINTR):
				return false, nil
			default:
				return false, err
			}
		})
		if err == nil {
			return end()
		}
		if !errors.Is(err, errTimeout) {
			return fmt.Errorf("unmount %s: %w", e.dir, err)
		}
	}
	if err := unix.Unmount(e.dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("lazy unmount %s: %w", e.dir, err)
	}
	if force {
		return end()
	}
	return fmt.Errorf("%w: %s unmounted lazily; the device is served until the kernel releases the file", ErrBusy, e.dir)
}

// pinMount clones the FUSE mount at dir (open_tree(2), a mount in no namespace) and returns
// the clone, which keeps the file system alive until closed, and the file system's device
// number, from the mount table (stat would ask the server).
func pinMount(dir string) (int, uint64, error) {
	ms, err := mountsAt(dir)
	if err != nil {
		return -1, 0, err
	}
	if len(ms) == 0 || !isFUSE(ms[len(ms)-1]) {
		return -1, 0, fmt.Errorf("no FUSE mount at %s", dir)
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, 0, fmt.Errorf("open_tree %s: %w", dir, err)
	}
	return fd, ms[len(ms)-1].dev, nil
}

// Cleanup removes a stale export at dir left by a process that died (or hangs) while
// exporting: it detaches every loop device bound to a file under dir or on the FUSE file
// system mounted there, then lazily unmounts that FUSE file system. It does nothing, and
// returns nil, when there is nothing to clean. It must not be called while a live process
// serves dir: its export would be torn down under it.
//
// A loop device that is still open (a file system mounted on it) is only marked auto-clear
// and goes away when its last user closes it; I/O to it fails with EIO meanwhile, because
// the server that answered it is gone.
func Cleanup(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("clean up export at %s: %w", dir, err)
	}
	mounts, err := mountsAt(abs)
	if err != nil {
		return fmt.Errorf("clean up export at %s: %w", abs, err)
	}
	fuseDevs := map[uint64]bool{}
	for _, m := range mounts {
		if isFUSE(m) {
			fuseDevs[m.dev] = true
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	prefix := abs + string(filepath.Separator)
	loops := loopsBackedBy(func(name, bf string) bool {
		return strings.HasPrefix(bf, prefix) || (len(fuseDevs) > 0 && fuseDevs[loopFSDev(name)])
	})
	for _, name := range loops {
		bf, _ := loopBackingFile(name)
		if err := detachLoop(ctx, "/dev/"+name, bf); err != nil {
			errs = append(errs, fmt.Errorf("detach /dev/%s: %w", name, err))
		}
	}
	// Top of the stack first; stop at anything that is not ours.
	for i := len(mounts) - 1; i >= 0; i-- {
		m := mounts[i]
		if !isFUSE(m) {
			errs = append(errs, fmt.Errorf("%s mounted at %s is not a FUSE export; left alone", m.fsType, abs))
			break
		}
		abortFUSE(m.dev)
		if err := unix.Unmount(abs, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("lazy unmount %s: %w", abs, err))
			break
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clean up export at %s: %w", abs, err)
	}
	return nil
}

// fuseConnections is where fusectl lists the FUSE connections, by the minor number of their
// file system's device.
const fuseConnections = "/sys/fs/fuse/connections"

// fusectlMagic is fusectl's statfs type (FUSE_CTL_SUPER_MAGIC).
const fusectlMagic = 0x65735543

// abortFUSE ends a FUSE connection through fusectl, if that is mounted. A dead server's
// connection is already gone, but a hung one would leave the loop driver's requests blocked
// forever; aborted, they fail with EIO and the devices above can be torn down.
func abortFUSE(dev uint64) {
	_ = abortConnection(dev) // best effort: a dead server's connection is gone anyway
}

// abortConnection ends the FUSE connection of the file system whose device is dev through
// fusectl, mounting fusectl first if it is not (a container's /sys often lacks it): every
// request, queued or to come, fails with ECONNABORTED or EIO, and its servers read ENODEV.
// A connection that has already ended is not an error.
func abortConnection(dev uint64) error {
	if unix.Major(dev) != 0 {
		return fmt.Errorf("device %d:%d is not a FUSE connection's", unix.Major(dev), unix.Minor(dev))
	}
	var st unix.Statfs_t
	if err := unix.Statfs(fuseConnections, &st); err != nil {
		return fmt.Errorf("fusectl: %w", err)
	}
	if st.Type != fusectlMagic {
		if err := unix.Mount("fusectl", fuseConnections, "fusectl", 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount fusectl at %s: %w", fuseConnections, err)
		}
	}
	p := filepath.Join(fuseConnections, strconv.FormatUint(uint64(unix.Minor(dev)), 10), "abort")
	if err := os.WriteFile(p, []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("abort: %w", err)
	}
	return nil
}

var errTimeout = errors.New("timed out")

// poll calls cond until it reports done or fails, or the deadline passes (errTimeout).
// cond runs at least once, even past the deadline.
func poll(deadline time.Time, cond func() (bool, error)) error {
	const interval = 20 * time.Millisecond
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		done, err := cond()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		if !time.Now().Before(deadline) {
			return errTimeout
		}
		<-t.C
	}
}
