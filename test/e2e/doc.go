// Package e2e holds black-box tests: they build the crdipc binary, run
// `crdipc up` as a user would, and drive it with kubectl and crdipc itself.
// kubectl must be on PATH.
package e2e
