package controlplane

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestCheckDataDir(t *testing.T) {
	base := t.TempDir()
	mk := func(name string, mode os.FileMode) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	own := mk("own", 0o700)
	readable := mk("readable", 0o755)
	groupWritable := mk("group-writable", 0o770)
	worldWritable := mk("world-writable", 0o1777)
	link := filepath.Join(base, "link")
	if err := os.Symlink(own, link); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dir, want string
	}{
		{own, ""},
		{readable, ""},
		{groupWritable, "writable by group or others"},
		{worldWritable, "writable by group or others"},
		{link, "symbolic link"},
		{file, "not a directory"},
	} {
		err := checkDataDir(c.dir)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v, want accepted", c.dir, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error saying %q", c.dir, err, c.want)
		}
	}
	if os.Geteuid() == 0 {
		// root may chown: a directory of another user is refused.
		other := mk("other", 0o700)
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := checkDataDir(other); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
			t.Errorf("another user's directory: %v", err)
		}
	}
}

// A CA planted as symlinks into the data dir (to another user's or another cluster's key)
// is refused, not adopted: the keys are read without following links.
func TestPKIRefusesSymlinkedKeys(t *testing.T) {
	dir := t.TempDir()
	if err := newPKI(filepath.Join(dir, "real")).ensure(); err != nil {
		t.Fatal(err)
	}
	planted := newPKI(filepath.Join(dir, "planted"))
	if err := os.MkdirAll(planted.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"ca.crt", "ca.key"} {
		if err := os.Symlink(filepath.Join(dir, "real", name), filepath.Join(planted.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	err := planted.ensure()
	if !errors.Is(err, syscall.ELOOP) {
		t.Fatalf("ensure with a symlinked CA: %v, want a refusal (ELOOP)", err)
	}
	// Fresh certificates are files of their own, written whole.
	fresh := newPKI(filepath.Join(dir, "fresh"))
	if err := fresh.ensure(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(fresh.adminKey); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin key: %v, %v; want a regular 0600 file", fi, err)
	}
}
