package blockdev

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// mountInfoPath is read for the mount table; a variable so tests can feed a fixture.
var mountInfoPath = "/proc/self/mountinfo"

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

// parseMountInfo parses one line of /proc/<pid>/mountinfo (proc(5)):
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
func parseMountInfo(line string) (mount, bool) {
	fields := strings.Fields(line)
	sep := -1
	for i, f := range fields {
		if f == "-" && i >= 6 {
			sep = i
			break
		}
	}
	if sep < 0 || sep+1 >= len(fields) {
		return mount{}, false
	}
	major, minor, ok := strings.Cut(fields[2], ":")
	if !ok {
		return mount{}, false
	}
	ma, err1 := strconv.ParseUint(major, 10, 32)
	mi, err2 := strconv.ParseUint(minor, 10, 32)
	if err1 != nil || err2 != nil {
		return mount{}, false
	}
	return mount{
		dev:        unix.Mkdev(uint32(ma), uint32(mi)),
		mountPoint: unescapeOctal(fields[4]),
		fsType:     fields[sep+1],
	}, true
}

// unescapeOctal undoes the kernel's \ooo escaping of space, tab, newline and backslash.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isFUSE(m mount) bool {
	return m.fsType == "fuse" || strings.HasPrefix(m.fsType, "fuse.")
}
