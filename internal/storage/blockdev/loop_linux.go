package blockdev

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// sysBlock is where the kernel lists block devices; a variable so tests can read it.
var sysBlock = "/sys/block"

// attachLoop binds a free loop device to file with losetup and reports whether the loop
// driver does direct I/O on it. The answer comes from sysfs, not from the flag we passed:
// depending on the kernel, an unsupported --direct-io=on either fails or silently falls
// back to buffered I/O.
func attachLoop(ctx context.Context, file string, mode DirectIOMode) (dev string, directIO bool, err error) {
	if mode != DirectIOOff {
		dev, err = losetupAttach(ctx, file, "--direct-io=on")
		if err == nil {
			directIO = loopDirectIO(dev)
			if mode == DirectIOOn && !directIO {
				derr := detachLoop(ctx, dev, file)
				return "", false, errors.Join(fmt.Errorf("loop device %s does not do direct I/O on %s", dev, file), derr)
			}
			return dev, directIO, nil
		}
		if mode == DirectIOOn {
			return "", false, err
		}
	}
	plain, perr := losetupAttach(ctx, file)
	if perr != nil {
		return "", false, errors.Join(err, perr)
	}
	return plain, loopDirectIO(plain), nil
}

func losetupAttach(ctx context.Context, file string, extra ...string) (string, error) {
	args := append([]string{"--find", "--show"}, extra...)
	args = append(args, file)
	out, err := run(ctx, "losetup", args...)
	dev := strings.TrimSpace(out)
	if err == nil && strings.HasPrefix(dev, "/dev/loop") {
		return dev, nil
	}
	// losetup may have bound a device before failing (setting direct I/O is a separate
	// step on some versions); leave none behind, or the fallback would bind a second one.
	var errs []error
	if err == nil {
		errs = append(errs, fmt.Errorf("losetup %s: unexpected output %q", strings.Join(args, " "), out))
	} else {
		errs = append(errs, err)
	}
	for _, name := range loopsBackedBy(func(_, bf string) bool { return bf == file }) {
		if derr := detachLoop(ctx, "/dev/"+name, file); derr != nil {
			errs = append(errs, derr)
		}
	}
	return "", errors.Join(errs...)
}

// detachLoop runs losetup -d, but only while dev is still bound to file: a loop device that
// was released can be re-used at once by someone else, whose device we must not detach.
// On a device that is still open (a mounted file system), the kernel only marks it
// auto-clear and releases the file when the last opener closes it.
func detachLoop(ctx context.Context, dev, file string) error {
	if bf, ok := loopBackingFile(filepath.Base(dev)); !ok || bf != file {
		return nil
	}
	if _, err := run(ctx, "losetup", "-d", dev); err != nil {
		if bf, ok := loopBackingFile(filepath.Base(dev)); !ok || bf != file {
			return nil // released meanwhile
		}
		return err
	}
	return nil
}

// loopBackingFile reads the path of the file a loop device (e.g. "loop3") is bound to;
// ok is false when the device is not bound.
func loopBackingFile(name string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(sysBlock, name, "loop", "backing_file"))
	if err != nil {
		return "", false
	}
	// sysfs marks a backing file unlinked since binding with " (deleted)"; it is still
	// the same file as far as we are concerned.
	return strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)"), true
}

func loopDirectIO(dev string) bool {
	b, err := os.ReadFile(filepath.Join(sysBlock, filepath.Base(dev), "loop", "dio"))
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

// loopsBackedBy lists the bound loop devices (names like "loop3") for which match, given
// the name and the backing file's path as sysfs shows it, reports true.
func loopsBackedBy(match func(name, backingFile string) bool) []string {
	entries, err := os.ReadDir(sysBlock)
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "loop") {
			continue
		}
		bf, ok := loopBackingFile(name)
		if !ok {
			continue
		}
		if match(name, bf) {
			names = append(names, name)
		}
	}
	return names
}

// loopSetCapacity makes the loop device dev re-read the size of its backing file.
func loopSetCapacity(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("set capacity of %s: %w", dev, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		return fmt.Errorf("set capacity of %s: %w", dev, err)
	}
	return nil
}

// loopSize reads the size of block device dev from sysfs, which counts 512-byte sectors.
func loopSize(dev string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(sysBlock, filepath.Base(dev), "size"))
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", dev, err)
	}
	sectors, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size of %s: %w", dev, err)
	}
	return sectors * 512, nil
}

// loopFSDev asks the loop driver for the device number of the file system holding its
// backing file. That identifies a FUSE mount even where the path does not (sysfs renders
// the path relative to the reader's root and mount namespace).
func loopFSDev(name string) uint64 {
	f, err := os.OpenFile("/dev/"+name, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer f.Close()
	st, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if err != nil {
		return 0
	}
	return st.Device
}

// run runs a command and returns its stdout; a failure carries its stderr.
func run(ctx context.Context, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
