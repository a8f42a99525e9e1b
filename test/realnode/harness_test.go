package realnode

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/shdoc"
)

// harnessDoc and harnessHeading locate the block of commands that users of the harness
// paste: the test runs it, so that the docs cannot drift from what works.
const (
	harnessDoc     = "docs/deploy.md"
	harnessHeading = "With the harness (what CI runs)"
)

// harness is docs/deploy.md's harness block, run in order, command by command, in one bash
// as a user pastes it: from a fresh directory, which holds links to the checkout's files
// (bin, hack, config, Makefile...) so that the block's relative paths work and up's
// default data directory ./.crdipc is the test's own.
type harness struct {
	dir     string
	cmds    []string
	next    int
	session *shdoc.Session
}

// startHarness starts the session; the test's cleanup ends it, and with it up, the
// background job the block starts.
func startHarness(t *testing.T) *harness {
	t.Helper()
	cmds, err := shdoc.Block(filepath.Join(root, harnessDoc), harnessHeading)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{dir: t.TempDir(), cmds: cmds}
	// make image writes bin/ in the checkout: the link must point at a directory.
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == ".git" || e.Name() == ".crdipc" {
			continue
		}
		if err := os.Symlink(filepath.Join(root, e.Name()), filepath.Join(h.dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if h.session, err = shdoc.Start(h.dir, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.session.Close(time.Minute); err != nil {
			t.Error(err)
		}
	})
	return h
}

// runThrough runs the block's next commands up to and including the first that starts
// with prefix, each within timeout, and returns that one's output. A command that fails
// fails the test with what the session printed.
func (h *harness) runThrough(t *testing.T, timeout time.Duration, prefix string, state func() string) string {
	t.Helper()
	for h.next < len(h.cmds) {
		cmd := h.cmds[h.next]
		h.next++
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		out, err := h.session.Run(ctx, cmd)
		cancel()
		if err != nil {
			t.Fatalf("%s, %q: %v\n%s\n%s", harnessDoc, cmd, err, tail(out, 60), state())
		}
		if strings.HasPrefix(cmd, prefix) {
			return out
		}
	}
	t.Fatalf("%s's harness block has no command %q after the ones run", harnessDoc, prefix)
	return ""
}

// skipThrough passes over the block's next commands up to and including the first that
// starts with prefix, running none: for a second cluster, what the first built is there.
func (h *harness) skipThrough(t *testing.T, prefix string) {
	t.Helper()
	for h.next < len(h.cmds) {
		h.next++
		if strings.HasPrefix(h.cmds[h.next-1], prefix) {
			return
		}
	}
	t.Fatalf("%s's harness block has no command %q after the ones run", harnessDoc, prefix)
}

// command is the block's command that starts with prefix, comment and all, for the steps
// the test runs at moments of its own (losing a node mid-write, the cleanup).
func (h *harness) command(t *testing.T, prefix string) string {
	t.Helper()
	for _, c := range h.cmds {
		if strings.HasPrefix(c, prefix) {
			return c
		}
	}
	t.Fatalf("%s's harness block has no command %q", harnessDoc, prefix)
	return ""
}

// commandCode is command without its trailing comment.
func (h *harness) commandCode(t *testing.T, prefix string) string {
	t.Helper()
	return shdoc.Code(h.command(t, prefix))
}

// down runs the block's down loop, if the session still runs (a failed command ends it).
func (h *harness) down(t *testing.T, timeout time.Duration) bool {
	t.Helper()
	if !h.session.Alive() {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := h.command(t, "for i in 3 2 1; do hack/realnode.sh down")
	if out, err := h.session.Run(ctx, cmd); err != nil {
		t.Errorf("%s, %q: %v\n%s", harnessDoc, cmd, err, tail(out, 60))
		return false
	}
	return true
}
