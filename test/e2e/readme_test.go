package e2e

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/crdipc/crdipc/internal/mountinfo"
	"github.com/crdipc/crdipc/internal/storage/blockdev"
	"github.com/crdipc/crdipc/internal/testenv/kubectl"
	"github.com/crdipc/crdipc/internal/testenv/require"
)

// readmeCommand is one line of a shell block in the README.
type readmeCommand struct {
	line    string   // as written
	args    []string // the command, `go run ./cmd/crdipc` replaced by the built binary
	refused string   // from a "# refused: X" comment: the command must fail, saying X
}

// readmeBlocks returns the ```sh blocks of README.md, each as its commands.
func readmeBlocks(t *testing.T) [][]readmeCommand {
	t.Helper()
	f, err := os.Open("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		blocks [][]readmeCommand
		cur    []readmeCommand
		in     bool
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !in && strings.TrimSpace(line) == "```sh":
			in, cur = true, nil
		case in && strings.TrimSpace(line) == "```":
			in = false
			blocks = append(blocks, cur)
		case in && strings.TrimSpace(line) != "":
			cur = append(cur, parseReadmeLine(line))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return blocks
}

// comment is a shell comment: a # after white space.
var comment = regexp.MustCompile(`\s#\s?(.*)$`)

func parseReadmeLine(line string) readmeCommand {
	c := readmeCommand{line: line}
	cmd := line
	if m := comment.FindStringSubmatchIndex(line); m != nil {
		cmd = line[:m[0]]
		if r, ok := strings.CutPrefix(line[m[2]:m[3]], "refused:"); ok {
			c.refused = strings.TrimSpace(r)
		}
	}
	c.args = strings.Fields(cmd)
	if len(c.args) >= 3 && c.args[0] == "go" && c.args[1] == "run" && c.args[2] == "./cmd/crdipc" {
		c.args = append([]string{binary}, c.args[3:]...)
	}
	return c
}

// findBlock returns the README block with a line starting with prefix.
func findBlock(t *testing.T, blocks [][]readmeCommand, prefix string) []readmeCommand {
	t.Helper()
	for _, b := range blocks {
		for _, c := range b {
			if strings.HasPrefix(c.line, prefix) {
				return b
			}
		}
	}
	t.Fatalf("README.md has no shell block with a line starting %q", prefix)
	return nil
}

// TestREADME runs `up` exactly as the README says — no flags, default data dir, in a fresh
// working directory — and then the README's walkthrough, line by line, from the repository
// root, as a user pasting it would.
func TestREADME(t *testing.T) {
	requireKubectl(t)
	// The walkthrough runs a pod with a volume: the data path needs FUSE, loop devices and
	// mounts, which the README says.
	require.Capable(t, "CRDIPC_REQUIRE_MOUNT", blockdev.Available())
	blocks := readmeBlocks(t)
	run := findBlock(t, blocks, "go run ./cmd/crdipc up")
	if len(run) != 1 {
		t.Fatalf("the README's run block has %d commands, want 1", len(run))
	}
	work := t.TempDir()
	var up *upProcess
	// Registered before up's own cleanup, so it runs after up stopped: a stopped up leaves
	// nothing mounted (a mount left on a FUSE file nobody serves fails the directory's
	// removal with "transport endpoint is not connected").
	t.Cleanup(func() {
		mounts, err := mountinfo.Read("/proc/self/mountinfo")
		if err != nil {
			t.Error(err)
			return
		}
		var left []string
		for _, m := range mounts {
			if strings.HasPrefix(m.MountPoint, work+"/") {
				left = append(left, m.MountPoint+" ("+m.FSType+")")
			}
		}
		if len(left) > 0 && up != nil {
			t.Errorf("up left mounts behind when it stopped:\n%s\nup's output:\n%s", strings.Join(left, "\n"), kubectl.Tail(up.Output.String(), 80))
		}
	})
	up = startIn(t, work, run[0].args[1:]...)

	// Every path up prints is absolute: the export line is pasted into another terminal,
	// whose working directory is anybody's guess.
	want := filepath.Join(work, ".crdipc", "kubeconfig")
	if up.Kubeconfig != want {
		t.Errorf("up printed KUBECONFIG=%s, want %s", up.Kubeconfig, want)
	}
	if sock := "unix://" + filepath.Join(work, ".crdipc", "csi", "csi.sock"); !strings.Contains(up.Output.String(), sock) {
		t.Errorf("up does not print the CSI endpoint as %s:\n%s", sock, up.Output.String())
	}

	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	// A newcomer takes the KUBECONFIG line for "ready": every sample the walkthrough applies
	// must be accepted the moment it appears (a pod, for one, is refused while namespace
	// default has no ServiceAccount yet). The walkthrough's own applies then change nothing.
	for _, dir := range []string{"config/samples/", "config/samples/csi/"} {
		if out, err := up.RunIn(root, "kubectl", "apply", "-f", dir); err != nil {
			t.Fatalf("kubectl apply -f %s, right after up printed its KUBECONFIG line: %v\n%s", dir, err, out)
		}
	}
	for _, c := range findBlock(t, blocks, "kubectl apply -f config/samples/") {
		out, err := up.RunIn(root, c.args[0], c.args[1:]...)
		switch {
		case c.refused == "" && err != nil:
			t.Fatalf("README line %q failed: %v\n%s\nup's output:\n%s", c.line, err, out, up.Output.String())
		case c.refused != "" && err == nil:
			t.Fatalf("README line %q succeeded; the README says it is refused (%s):\n%s", c.line, c.refused, out)
		case c.refused != "" && !strings.Contains(out, c.refused):
			t.Fatalf("README line %q was refused without saying %q:\n%s", c.line, c.refused, out)
		}
		t.Logf("$ %s\n%s", c.line, out)
	}
}
