package safefile_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/crdipc/crdipc/internal/safefile"
)

func TestWriteReplacesAtomically(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "key.pem")
	for _, content := range []string{"first", "second"} {
		if err := safefile.Write(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := safefile.ReadFile(path)
		if err != nil || string(got) != content {
			t.Fatalf("read %q, %v; want %q", got, err, content)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the file (no temporaries left)", len(entries))
	}
}

// A symlink planted at the name is replaced by the file, and its target is untouched.
func TestWriteDoesNotFollowASymlink(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ca.crt")
	if err := os.Symlink(victim, path); err != nil {
		t.Fatal(err)
	}
	if err := safefile.Write(path, []byte("ours"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(victim); string(got) != "precious" {
		t.Errorf("symlink target now holds %q", got)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSymlink != 0 {
		t.Errorf("%s is still a symlink (%v)", path, err)
	}
}

func TestReadAndOpenRefuseASymlink(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	if _, err := safefile.ReadFile(link); !errors.Is(err, syscall.ELOOP) {
		t.Errorf("ReadFile through a symlink: %v, want ELOOP", err)
	}
	if f, err := safefile.OpenFile(link, os.O_RDWR|os.O_CREATE, 0o600); !errors.Is(err, syscall.ELOOP) {
		if f != nil {
			f.Close()
		}
		t.Errorf("OpenFile through a symlink: %v, want ELOOP", err)
	}
}

func TestWriteFailureLeavesTheOldContent(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "meta.json")
	if err := safefile.Write(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := safefile.WriteFrom(path, 0o600, func(f *os.File) error {
		f.Write([]byte("half"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("WriteFrom: %v, want boom", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Errorf("after a failed write the file holds %q, want the old content", got)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("a failed write left %d entries, want 1", len(entries))
	}
}
