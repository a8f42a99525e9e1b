package services

import (
	"fmt"
	"path/filepath"
)

// Absolute resolves each non-empty path in place against the working directory. Commands
// call it first thing: a relative path kept as given means something else to every
// process, URL and printed line it reaches later (a relative unix:// socket becomes a host
// name to gRPC; `export KUBECONFIG=.crdipc/kubeconfig` is wrong in the next terminal).
func Absolute(paths ...*string) error {
	for _, p := range paths {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return fmt.Errorf("resolving %s: %w", *p, err)
		}
		*p = abs
	}
	return nil
}
