//go:build !linux

package podsim

import "syscall"

// setDeathSignal: only Linux has a parent-death signal; elsewhere the processes of an up
// that dies keep running until they exit or are killed.
func setDeathSignal(*syscall.SysProcAttr) {}
