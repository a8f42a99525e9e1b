// Package require is the one require-or-skip of crdipc's tests. A test that needs something
// of the host (a tool, mount privilege, a real node) skips where it is missing, so a laptop
// runs what it can, unless the capability's CRDIPC_REQUIRE_* variable is "1": CI sets them
// all, and there a missing capability is a failure, never a silent skip.
//
// It imports nothing of crdipc's, so the tests of any package can use it, those of packages
// internal/testenv imports included.
//
// The tools Tool looks up are compared with what the install scripts install
// (hack/test-deps.sh --list, hack/realnode.sh tools) by this package's tests: name a tool in
// a literal, so that the comparison sees it.
package require
