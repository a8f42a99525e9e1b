package controlplane

import (
	"fmt"
	"os"
	"syscall"
)

// checkDataDir refuses a data directory another user could tamper with: it holds the
// cluster's CA key, the admin's client key and etcd's data, so whoever may write into it
// owns the cluster. It must be owned by the user running crdipc and writable by nobody
// else (a directory in the shared /tmp, or one created with a permissive umask, is not).
func checkDataDir(dir string) error {
	info, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if info.Mode()&os.ModeSymlink != 0 {
		// Start resolves links first; a link here was put in place since.
		return fmt.Errorf("data dir %s is a symbolic link: give the directory it points to", dir)
	}
	if !info.IsDir() {
		return fmt.Errorf("data dir %s is not a directory", dir)
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("data dir %s is owned by uid %d, not by this user (uid %d): it holds the cluster's keys; use a directory of your own", dir, st.Uid, os.Geteuid())
	}
	if perm := info.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("data dir %s is writable by group or others (mode %04o): it holds the cluster's keys; chmod go-w %s, or use a directory of your own", dir, perm, dir)
	}
	return nil
}
