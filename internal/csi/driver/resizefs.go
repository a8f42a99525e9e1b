package driver

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	utilexec "k8s.io/utils/exec"
)

// OnlineResizeAvailable says why this process cannot grow a mounted file system of fsType
// in place, or nil when it can. ext3 and ext4 grow online through an ioctl that needs
// CAP_SYS_RESOURCE (resize2fs otherwise fails with "Permission denied to resize
// filesystem"), which a container's default capability set lacks; xfs_growfs needs
// CAP_SYS_ADMIN, which mounting needs anyway.
func OnlineResizeAvailable(fsType string) error {
	if !strings.HasPrefix(fsType, "ext") {
		return nil
	}
	ok, err := effectiveCap(unix.CAP_SYS_RESOURCE)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("growing a mounted %s file system needs CAP_SYS_RESOURCE, which the driver's process lacks", fsType)
	}
	return nil
}

// effectiveCap reports whether capability c is in this process's effective set.
func effectiveCap(c int) (bool, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false, fmt.Errorf("reading the process's capabilities: %w", err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			set, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return false, fmt.Errorf("parsing the process's capabilities %q: %w", l, err)
			}
			return set&(1<<uint(c)) != 0, nil
		}
	}
	return false, fmt.Errorf("no CapEff line in /proc/self/status")
}

// extBytes is the size in bytes of the ext2/3/4 file system on dev, from its superblock
// (dumpe2fs -h, which reads a mounted one too).
func extBytes(ex utilexec.Interface, dev string) (int64, error) {
	out, err := ex.Command("dumpe2fs", "-h", dev).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("dumpe2fs -h %s: %v: %s", dev, err, oneLine(string(out)))
	}
	var count, size int64
	for _, l := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "Block count":
			count, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		case "Block size":
			size, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
		if err != nil {
			return 0, fmt.Errorf("dumpe2fs -h %s: %q: %w", dev, l, err)
		}
	}
	if count <= 0 || size <= 0 {
		return 0, fmt.Errorf("dumpe2fs -h %s names no block count and size", dev)
	}
	return count * size, nil
}

// growExtOffline grows the unmounted ext file system on dev to the device's size when the
// device is larger, and says whether it did: a volume grown while it was mounted on a node
// that could not grow it online (no CAP_SYS_RESOURCE) gets its space at the next stage, as
// the CSI spec has it for NodeExpandVolume's FAILED_PRECONDITION. Offline growth needs no
// capability beyond writing the device; resize2fs insists on a forced check first.
func growExtOffline(ex utilexec.Interface, dev string) (bool, error) {
	have, err := extBytes(ex, dev)
	if err != nil {
		return false, err
	}
	want, err := deviceSize(dev)
	if err != nil {
		return false, fmt.Errorf("size of %s: %w", dev, err)
	}
	if have >= want {
		return false, nil
	}
	// -p repairs what is safe to repair unattended; exit 1 says it did, 2 and up that
	// something is left (or it failed), and then nothing is grown.
	if out, err := ex.Command("e2fsck", "-f", "-p", dev).CombinedOutput(); err != nil {
		var ee utilexec.ExitError
		if !errors.As(err, &ee) || ee.ExitStatus() != 1 {
			return false, fmt.Errorf("e2fsck -f -p %s before growing it: %v: %s", dev, err, oneLine(string(out)))
		}
	}
	if out, err := ex.Command("resize2fs", dev).CombinedOutput(); err != nil {
		return false, fmt.Errorf("resize2fs %s: %v: %s", dev, err, oneLine(string(out)))
	}
	return true, nil
}
