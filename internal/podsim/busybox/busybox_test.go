package busybox

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestCommand: the container's command and args run as the image would run them, with
// the host's programs.
func TestCommand(t *testing.T) {
	sleep, err := exec.LookPath("sleep") // coreutils: on every machine the image runs on
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name          string
		command, args []string
		path          string
		argv          []string
	}{
		{"nothing is sh", nil, nil, "/bin/sh", []string{"sh"}},
		{"command and args", []string{"sh", "-c"}, []string{"echo hi"}, "/bin/sh", []string{"sh", "-c", "echo hi"}},
		{"args alone are the command", nil, []string{"sleep", "1"}, sleep, []string{"sleep", "1"}},
		{"busybox names the applet", []string{"busybox", "sh"}, []string{"-c", "true"}, "/bin/sh", []string{"sh", "-c", "true"}},
		{"absolute paths stay", []string{"/bin/sh"}, nil, "/bin/sh", []string{"/bin/sh"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Image{}.Command(&corev1.Pod{}, &corev1.Container{Command: tc.command, Args: tc.args}, "", nil, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			if p.Cmd.Path != tc.path || !slices.Equal(p.Cmd.Args, tc.argv) {
				t.Errorf("runs %s %q, want %s %q", p.Cmd.Path, p.Cmd.Args, tc.path, tc.argv)
			}
			if p.Cmd.Env != nil || p.Cmd.Dir != "" {
				t.Errorf("environment %q and directory %q are the runtime's to set", p.Cmd.Env, p.Cmd.Dir)
			}
		})
	}
	_, err = Image{}.Command(&corev1.Pod{}, &corev1.Container{Command: []string{"no-such-applet"}}, "", map[string]string{"PATH": "/nonexistent"}, "")
	if err == nil || !strings.Contains(err.Error(), "no-such-applet") {
		t.Errorf("a program the host lacks: got %v", err)
	}
}
