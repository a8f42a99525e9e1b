//go:build !linux

package podsim

import (
	"errors"
	"os/exec"
)

var errNoMountNamespaces = errors.New("mount namespaces exist only on Linux")

// startInMountNamespace: only Linux has mount namespaces.
func startInMountNamespace(*exec.Cmd, []bindMount, <-chan struct{}) ([]string, error) {
	return nil, errNoMountNamespaces
}

func mountNamespaces() error { return errNoMountNamespaces }

// mountsUnder: nothing is ever mounted where there are no mount namespaces.
func mountsUnder(string) []string { return nil }

func isMountPoint(string) bool { return false }

func unmountDetach(string) error { return nil }
