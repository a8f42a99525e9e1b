// Package busybox is the podsim Image of `busybox` (any tag): it runs a container's command
// with the host's tools, not busybox's. busybox's applets are ordinary Unix commands, so a
// pod spec written for busybox — sh -c '…', sleep, cat, sha256sum — runs as it would in
// the image, with the host's /bin/sh and the programs on the host's PATH (or the
// container's PATH, when its env sets one).
package busybox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/crdipc/crdipc/internal/podsim"
)

// Name is the image repository Image runs, as podsim.Options.Images names it.
const Name = "busybox"

// Image runs busybox containers as host processes.
type Image struct{}

// Command implements podsim.Image. As in the image, which has no entrypoint and the
// command sh: command and args run as given, args alone are the command, and nothing at
// all is sh. A leading "busybox" (busybox sh -c …) names the applet that follows.
func (Image) Command(_ *corev1.Pod, c *corev1.Container, _ string, env map[string]string, _ string) (*podsim.Process, error) {
	argv := append(append([]string(nil), c.Command...), c.Args...)
	if len(argv) == 0 {
		argv = []string{"sh"}
	}
	if filepath.Base(argv[0]) == "busybox" && len(argv) > 1 {
		argv = argv[1:]
	}
	path, err := lookPath(argv[0], env)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, argv[1:]...)
	cmd.Args[0] = argv[0]
	return &podsim.Process{Cmd: cmd}, nil
}

// lookPath resolves an applet: sh is the host's /bin/sh; other names are looked up in the
// container's PATH, or the host's.
func lookPath(name string, env map[string]string) (string, error) {
	if name == "sh" {
		return "/bin/sh", nil
	}
	if strings.Contains(name, "/") {
		return name, nil
	}
	path, ok := env["PATH"]
	if !ok {
		path = os.Getenv("PATH")
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q is not on PATH %s: busybox runs the host's programs, and the host has none of that name", name, path)
}
