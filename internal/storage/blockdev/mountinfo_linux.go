package blockdev

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/crdipc/crdipc/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// mountInfoPath is read for the mount table; a variable so tests can feed a fixture.
var mountInfoPath = mountinfo.Self

type mount struct {
	dev        uint64 // st_dev of the mounted file system
	mountPoint string
	fsType     string
}

// mountsAt lists the mounts stacked at dir, bottom first. Reading the table, unlike
// stat(2), works on a FUSE mount whose server is dead (stat fails with ENOTCONN there).
func mountsAt(dir string) ([]mount, error) {
	f, err := os.Open(mountInfoPath)
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	var out []mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m, ok := parseMountInfo(sc.Text())
		if ok && m.mountPoint == dir {
			out = append(out, m)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	return out, nil
}

// parseMountInfo parses one line of the mount table (package mountinfo).
func parseMountInfo(line string) (mount, bool) {
	e, ok := mountinfo.Parse(line)
	if !ok {
		return mount{}, false
	}
	major, minor, ok := strings.Cut(e.Dev, ":")
	if !ok {
		return mount{}, false
	}
	ma, err1 := strconv.ParseUint(major, 10, 32)
	mi, err2 := strconv.ParseUint(minor, 10, 32)
	if err1 != nil || err2 != nil {
		return mount{}, false
	}
	return mount{dev: unix.Mkdev(uint32(ma), uint32(mi)), mountPoint: e.MountPoint, fsType: e.FSType}, true
}

func isFUSE(m mount) bool {
	return m.fsType == "fuse" || strings.HasPrefix(m.fsType, "fuse.")
}
