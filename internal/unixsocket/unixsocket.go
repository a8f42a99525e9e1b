// Package unixsocket listens on Unix socket files that a successor may take over while
// this process still runs: a DaemonSet's surge pod, or a restarted container whose old
// process lingers, binds the same path, and the predecessor must then leave the file alone.
// The CSI driver's socket, its handover socket and the kubelet registration socket are
// such files.
package unixsocket

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
)

// Listener is a Unix socket listener that removes its socket file (Remove, Close) only
// while the file is still the one it bound.
type Listener struct {
	*net.UnixListener
	path string
	fi   os.FileInfo

	removeOnce sync.Once
	removeErr  error
}

// Listen binds the Unix socket path, replacing a socket file left there: by a run that did
// not stop cleanly, or by a predecessor that still runs and is to be replaced. Binding
// needs the name free, and a watcher of the directory (the kubelet's plugin watcher) sees
// the new socket created. The directory must exist.
func Listen(path string) (*Listener, error) { return ListenNetwork("unix", path) }

// ListenNetwork is Listen for network "unix" (a stream socket) or "unixpacket".
func ListenNetwork(network, path string) (*Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing stale socket: %w", err)
	}
	l, err := net.ListenUnix(network, &net.UnixAddr{Name: path, Net: network})
	if err != nil {
		return nil, err
	}
	// Removed by Remove, and only while it is still this listener's.
	l.SetUnlinkOnClose(false)
	fi, err := os.Lstat(path)
	if err != nil {
		l.Close()
		return nil, err
	}
	return &Listener{UnixListener: l, path: path, fi: fi}, nil
}

// Path is the socket file's path.
func (l *Listener) Path() string { return l.path }

// Current reports whether the socket file at Path is still the one this listener bound:
// false once it was removed, or replaced by a successor's.
func (l *Listener) Current() bool {
	now, err := os.Lstat(l.path)
	return err == nil && os.SameFile(l.fi, now)
}

// Remove removes the socket file if it is still this listener's, and leaves the listener
// open: connections already made go on. Only the first call does anything.
func (l *Listener) Remove() error {
	l.removeOnce.Do(func() {
		if l.Current() {
			if err := os.Remove(l.path); err != nil && !errors.Is(err, os.ErrNotExist) {
				l.removeErr = fmt.Errorf("removing socket %s: %w", l.path, err)
			}
		}
	})
	return l.removeErr
}

// Close closes the listener, then removes its socket file as Remove does.
func (l *Listener) Close() error {
	err := l.UnixListener.Close()
	return errors.Join(err, l.Remove())
}
