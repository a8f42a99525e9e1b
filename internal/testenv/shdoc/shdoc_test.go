package shdoc_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/shdoc"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

const doc = "# Title\n\n```sh\necho not this one\n```\n\n" +
	"### With the harness (what CI runs)\n\nText.\n\n```sh\n" +
	"make image                # a comment\n" +
	"X=1; export Y=2\n" +
	"for i in 1 2; do\n" +
	"  echo $i \\\n" +
	"    more   # inside\n" +
	"done\n" +
	"for i in 3 2 1; do echo $i; done\n" +
	"                          # a comment of its own\n" +
	"echo '# not a comment' done\n" +
	"```\n\n```sh\necho later block\n```\n"

func TestBlock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "doc.md")
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := shdoc.Block(path, "With the harness (what CI runs)")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"make image                # a comment",
		"X=1; export Y=2",
		"for i in 1 2; do\n  echo $i \\\n    more   # inside\ndone",
		"for i in 3 2 1; do echo $i; done",
		"echo '# not a comment' done",
	}
	if !slices.Equal(got, want) {
		t.Errorf("Block:\n%q\nwant\n%q", got, want)
	}
	for cmd, want := range map[string]string{
		"hack/realnode.sh kill --dir /tmp/x     # lose it": "hack/realnode.sh kill --dir /tmp/x",
		"echo '# kept' \"#kept\" a#b # dropped":            "echo '# kept' \"#kept\" a#b",
	} {
		if got := shdoc.Code(cmd); got != want {
			t.Errorf("Code(%q) = %q, want %q", cmd, got, want)
		}
	}
	if _, err := shdoc.Block(path, "No such heading"); err == nil || !strings.Contains(err.Error(), "no heading") {
		t.Errorf("a missing heading: %v", err)
	}
}

// Variables and the directory carry from one command to the next, a failing command ends
// the session with an error, and Close ends its background jobs.
func TestSession(t *testing.T) {
	dir := t.TempDir()
	s, err := shdoc.Start(dir, []string{"SHDOC_TEST=from-env"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	steps := []struct{ cmd, want string }{
		{"V=kept; mkdir sub && cd sub", ""},
		{"echo $V $SHDOC_TEST $(basename $PWD)", "kept from-env sub\n"},
		{"for i in 1 2; do\n  echo n$i\ndone", "n1\nn2\n"},
		{"printf 'no newline'", "no newline\n"},
	}
	for _, st := range steps {
		out, err := s.Run(ctx, st.cmd)
		if err != nil || out != st.want {
			t.Fatalf("Run(%q) = %q, %v; want %q", st.cmd, out, err, st.want)
		}
	}
	if _, err := s.Run(ctx, "sleep 600 & echo $! > ../job.pid"); err != nil {
		t.Fatal(err)
	}
	out, err := s.Run(ctx, "echo before; false; echo after")
	if err == nil {
		t.Fatalf("a failing command: %q, no error", out)
	}
	// Run returns once bash has exited; what it printed just before may still be in the
	// pipe (a background job holds it open), so the session's output is waited for.
	waitErr := wait.Until(ctx, 10*time.Second, func(context.Context) (bool, error) {
		return strings.Contains(s.Output(), "before\n"), nil
	})
	if waitErr != nil || strings.Contains(s.Output(), "after") {
		t.Fatalf("a failing command printed %q; want %q and not %q", s.Output(), "before", "after")
	}
	if s.Alive() {
		t.Error("the session goes on after a failed command")
	}
	if err := s.Close(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	pid, err := os.ReadFile(filepath.Join(dir, "job.pid"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/proc/" + strings.TrimSpace(string(pid))); err == nil {
		t.Errorf("the background job %s outlived Close", strings.TrimSpace(string(pid)))
	}
}
