// Package crdipc holds what the whole module shares and nothing else: its version, from the
// VERSION file, which the container image tag (config/default) and `crdipc version` both use.
package crdipc

import (
	_ "embed"
	"strings"
)

//go:embed VERSION
var version string

// Version is crdipc's release version, e.g. "0.2.0".
func Version() string { return strings.TrimSpace(version) }
