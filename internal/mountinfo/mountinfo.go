// Package mountinfo reads a Linux mount table (/proc/<pid>/mountinfo, proc(5)). The CSI
// driver, the block-device export and the simulated kubelet all decide from it what is
// mounted where: the table, unlike stat(2), also answers for a bind mount of a file and for
// a FUSE mount whose server died. k8s.io/mount-utils parses it too, but does not undo the
// kernel's octal escapes in paths.
package mountinfo

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Self is the node's mount table as this process sees it: that of the calling thread. Not
// /proc/self, which is the main thread's: podsim starts a container from a locked thread it
// moves into a mount namespace of its own, and when that thread is the main thread Go
// cannot end it, so /proc/self then shows the container's mounts for good. Every other
// thread (any goroutine that did not lock one) stays in the node's namespace.
const Self = "/proc/thread-self/mountinfo"

// Entry is one line of the table.
type Entry struct {
	Dev        string // major:minor of the mounted file system
	Root       string // the directory of that file system mounted here ("/" unless a bind mount of a part)
	MountPoint string
	ReadOnly   bool // the per-mount read-only flag
	FSType     string
	Source     string // e.g. the loop device of a loop mount
}

// Read parses the table at path (Self for this process's).
func Read(path string) ([]Entry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	defer f.Close()
	var out []Entry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if e, ok := Parse(sc.Text()); ok {
			out = append(out, e)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the mount table: %w", err)
	}
	return out, nil
}

// Parse parses one line:
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//
// that is id, parent id, major:minor, root, mount point, per-mount options, optional fields
// up to "-", then file system type, source and super block options.
func Parse(line string) (Entry, bool) {
	f := strings.Fields(line)
	if len(f) < 6 {
		return Entry{}, false
	}
	e := Entry{Dev: f[2], Root: Unescape(f[3]), MountPoint: Unescape(f[4])}
	for _, o := range strings.Split(f[5], ",") {
		if o == "ro" {
			e.ReadOnly = true
		}
	}
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			if i+1 < len(f) {
				e.FSType = f[i+1]
			}
			if i+2 < len(f) {
				e.Source = Unescape(f[i+2])
			}
			return e, true
		}
	}
	return Entry{}, false
}

// Unescape undoes the table's octal escapes of space, tab, newline and backslash.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
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
