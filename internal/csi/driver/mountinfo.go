package driver

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// mountInfoPath is this process's mount table.
const mountInfoPath = "/proc/self/mountinfo"

// mountEntry is one line of the mount table.
type mountEntry struct {
	dev      string // major:minor of the mounted file system
	root     string // the directory of that file system mounted here ("/" unless a bind mount of a part)
	point    string // the mount point
	readonly bool   // the per-mount read-only flag
	fstype   string
	source   string // for a loop mount the loop device, e.g. /dev/loop3
}

// mountAt returns the topmost mount whose mount point is path, if any. The table is read, not
// stat(2) compared with the parent: a bind mount of a file, or of a directory of the same file
// system, has its parent's device number.
func mountAt(path string) (mountEntry, bool, error) {
	p := filepath.Clean(path)
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r // the kernel records the resolved path
	}
	data, err := os.ReadFile(mountInfoPath)
	if err != nil {
		return mountEntry{}, false, fmt.Errorf("reading the mount table: %w", err)
	}
	var found mountEntry
	ok := false
	for _, line := range strings.Split(string(data), "\n") {
		m, valid := parseMountInfo(line)
		if valid && m.point == p {
			found, ok = m, true // a later line is mounted on top of an earlier one
		}
	}
	return found, ok, nil
}

// parseMountInfo parses one line of /proc/self/mountinfo:
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//
// that is id, parent id, major:minor, root, mount point, per-mount options, optional fields
// up to "-", then file system type, source and super block options.
func parseMountInfo(line string) (mountEntry, bool) {
	f := strings.Fields(line)
	if len(f) < 6 {
		return mountEntry{}, false
	}
	m := mountEntry{dev: f[2], root: unescapeMountPath(f[3]), point: unescapeMountPath(f[4])}
	for _, o := range strings.Split(f[5], ",") {
		if o == "ro" {
			m.readonly = true
		}
	}
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			if i+1 < len(f) {
				m.fstype = f[i+1]
			}
			if i+2 < len(f) {
				m.source = unescapeMountPath(f[i+2])
			}
			break
		}
	}
	return m, true
}

// isMountPoint reports whether path is a mount point; an unreadable table counts as no.
func isMountPoint(path string) bool {
	_, ok, err := mountAt(path)
	return ok && err == nil
}

// unescapeMountPath undoes the table's octal escapes of space, tab, newline and backslash.
func unescapeMountPath(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// loopBackingFile is the file behind the loop device dev (such as /dev/loop3), or "" when dev
// is not a loop device with a file bound to it.
func loopBackingFile(dev string) string {
	name := filepath.Base(dev)
	if filepath.Dir(dev) != "/dev" || !strings.HasPrefix(name, "loop") {
		return ""
	}
	data, err := os.ReadFile(filepath.Join("/sys/block", name, "loop", "backing_file"))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(strings.TrimSpace(string(data)), " (deleted)")
}

// sameFile reports whether paths a and b name the same existing file.
func sameFile(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	if err != nil {
		return false
	}
	return os.SameFile(fa, fb)
}

// within reports whether path lies inside dir (both absolute or both relative; symbolic links
// in dir are resolved).
func within(path, dir string) bool {
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		dir = r
	}
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../") && !filepath.IsAbs(rel)
}
