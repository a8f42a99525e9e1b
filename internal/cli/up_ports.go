package cli

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// listenOrAny binds addr. A default address that is taken (8080 is taken on many a
// developer's machine) falls back to any free port on the same host, which up prints: up
// must start. An address the user chose (explicit) fails loudly instead.
func listenOrAny(name, addr string, explicit bool) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil || explicit || !errors.Is(err, syscall.EADDRINUSE) {
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		return ln, nil
	}
	host, _, _ := net.SplitHostPort(addr)
	ln, err2 := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err2 != nil {
		return nil, fmt.Errorf("%s: %w (and no free port on %s: %v)", name, err, host, err2)
	}
	return ln, nil
}
