package podsim

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	goruntime "runtime"
	"sort"
	"strings"
	"sync"

	"github.com/crdipc/crdipc/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// startInMountNamespace starts cmd in a mount namespace of its own in which every mount is
// bind-mounted at its dst. It returns the directories it had to create on the node for the
// mount points.
//
// Go runs no code of ours between fork and exec, but it does start a child from the
// thread that asks: so a goroutine locks itself to a thread, moves that thread into a new
// mount namespace, mounts there and starts the process, which inherits the namespace. The
// thread is never unlocked, so Go terminates it when the goroutine returns instead of
// running other goroutines in the container's namespace; and the goroutine returns only
// when the process has exited (exited is closed), because the kernel sends a process its
// Pdeathsig when the thread that started it ends.
func startInMountNamespace(cmd *exec.Cmd, mounts []bindMount, exited <-chan struct{}) ([]string, error) {
	type result struct {
		created []string
		err     error
	}
	res := make(chan result, 1)
	run := func() {
		created, err := enterMounts(mounts)
		if err == nil {
			err = cmd.Start()
		}
		res <- result{created, err}
		if err == nil {
			<-exited
		}
	}
	go onOwnThread(run)
	r := <-res
	return r.created, r.err
}

// onOwnThread runs f on an OS thread locked to it, which ends when f returns: a thread
// that entered a namespace of its own must never run other goroutines. It is never the
// main thread: Go cannot end that one, only park it for good, so a namespace entered there
// would live on with it, holding whatever is mounted in it (unstaging a volume would wait
// forever for its loop device), and would become what /proc/self shows.
func onOwnThread(f func()) {
	goruntime.LockOSThread()
	if unix.Gettid() != unix.Getpid() {
		f()
		return
	}
	// While this goroutine holds the main thread, one that locks a thread cannot get it.
	locked := make(chan struct{})
	go func() {
		goruntime.LockOSThread()
		close(locked)
		f()
	}()
	<-locked
	goruntime.UnlockOSThread()
}

// enterMounts moves the calling (locked) thread into a new mount namespace and bind-mounts
// each mount there, parents first.
func enterMounts(mounts []bindMount) ([]string, error) {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("creating a mount namespace: %w", err)
	}
	// Private: the container's mounts stay in its namespace, and the node's later unmounts
	// (NodeUnpublishVolume) do not reach into it while it runs.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("making the mount namespace private: %w", err)
	}
	var created []string
	for i, m := range mounts {
		fi, err := os.Stat(m.src)
		if err != nil {
			return created, fmt.Errorf("volume mount at %s: %w", m.dst, err)
		}
		// Directories made below another mount of this container are made in that volume;
		// only the others are the node's.
		onNode := true
		for _, p := range mounts[:i] {
			if m.dst == p.dst || strings.HasPrefix(m.dst, p.dst+"/") {
				onNode = false
			}
		}
		made, err := makeMountPoint(m.dst, fi.IsDir())
		if onNode {
			created = append(created, made...)
		}
		if err != nil {
			return created, fmt.Errorf("creating mount point %s: %w", m.dst, err)
		}
		if err := unix.Mount(m.src, m.dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return created, fmt.Errorf("bind-mounting %s at %s: %w", m.src, m.dst, err)
		}
		if m.readOnly {
			if err := unix.Mount("", m.dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
				return created, fmt.Errorf("making %s read-only: %w", m.dst, err)
			}
		}
	}
	return created, nil
}

// makeMountPoint creates dst (a directory, or an empty file for a file), with its missing
// parents, and returns what it created, shallowest first.
func makeMountPoint(dst string, dir bool) ([]string, error) {
	var missing []string
	for p := dst; ; {
		if _, err := os.Lstat(p); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		missing = append(missing, p)
		parent := p[:max(strings.LastIndexByte(p, '/'), 1)]
		if parent == p {
			break
		}
		p = parent
	}
	var created []string
	for i := len(missing) - 1; i >= 0; i-- {
		p := missing[i]
		var err error
		if i == 0 && !dir {
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o644); err == nil {
				err = f.Close()
			}
		} else {
			err = os.Mkdir(p, 0o755)
		}
		if err != nil && !errors.Is(err, os.ErrExist) {
			return created, err
		}
		if err == nil {
			created = append(created, p)
		}
	}
	return created, nil
}

var mountNS struct {
	once sync.Once
	err  error
}

// mountNamespaces says whether this process may create mount namespaces (CAP_SYS_ADMIN):
// it tries, once, on a thread that is thrown away afterwards.
func mountNamespaces() error {
	mountNS.once.Do(func() {
		done := make(chan error, 1)
		go onOwnThread(func() { done <- unix.Unshare(unix.CLONE_NEWNS) })
		if err := <-done; err != nil {
			mountNS.err = fmt.Errorf("this process cannot create mount namespaces: %w", err)
		}
	})
	return mountNS.err
}

// mountsUnder are the mount points at or below dir in this process's mount table, deepest
// first.
func mountsUnder(dir string) []string {
	entries, err := mountinfo.Read(mountinfo.Self)
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if p := e.MountPoint; p == dir || strings.HasPrefix(p, dir+"/") {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// isMountPoint says whether path is a mount point in this process's mount table.
func isMountPoint(path string) bool {
	for _, m := range mountsUnder(path) {
		if m == path {
			return true
		}
	}
	return false
}

// unmountDetach detaches the mount at path (lazily: in use, it goes when its users do).
func unmountDetach(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting %s: %w", path, err)
	}
	return nil
}
