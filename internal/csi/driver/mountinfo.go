package driver

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/mountinfo"
)

// mountInfoPath is this process's mount table.
const mountInfoPath = mountinfo.Self

// mountEntry is one line of the mount table.
type mountEntry struct {
	dev      string // major:minor of the mounted file system
	root     string // the directory of that file system mounted here ("/" unless a bind mount of a part)
	point    string // the mount point
	readonly bool   // the per-mount read-only flag
	fstype   string
	source   string   // for a loop mount the loop device, e.g. /dev/loop3
	options  []string // the per-mount options: rw or ro, nodev, nosuid, relatime, …
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

// parseMountInfo parses one line of the mount table (package mountinfo).
func parseMountInfo(line string) (mountEntry, bool) {
	e, ok := mountinfo.Parse(line)
	if !ok {
		return mountEntry{}, false
	}
	// Field 6 is the per-mount options; Parse has checked there are that many.
	opts := strings.Split(strings.Fields(line)[5], ",")
	return mountEntry{dev: e.Dev, root: e.Root, point: e.MountPoint, readonly: e.ReadOnly, fstype: e.FSType, source: e.Source, options: opts}, true
}

// isMountPoint reports whether path is a mount point; an unreadable table counts as no.
func isMountPoint(path string) bool {
	_, ok, err := mountAt(path)
	return ok && err == nil
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

// loopDeviceOf is the loop device (such as /dev/loop3) whose device node path is, for
// instance through a bind mount, or "" when path is no loop device.
func loopDeviceOf(path string) string {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return ""
	}
	sys, err := filepath.EvalSymlinks(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)))
	if err != nil || !strings.HasPrefix(filepath.Base(sys), "loop") {
		return ""
	}
	return "/dev/" + filepath.Base(sys)
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
