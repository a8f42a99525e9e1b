package driver

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
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
