package replica

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// setUserTimeout bounds how long data sent on c may stay unacknowledged before the kernel
// closes the connection (TCP_USER_TIMEOUT). Keepalive probes only go out on an idle
// connection: a peer lost while a reply to it was in flight is otherwise retransmitted to
// for a quarter of an hour (tcp_retries2), and holds its writer session all that time.
func setUserTimeout(c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(deadPeerAfter.Milliseconds()))
	})
	if err != nil {
		return err
	}
	return serr
}

// deadPeerTCP applies the dead-peer settings to an accepted connection.
func deadPeerTCP(tc *net.TCPConn) {
	_ = tc.SetKeepAliveConfig(KeepAlive)
	if rc, err := tc.SyscallConn(); err == nil {
		_ = setUserTimeout(rc)
	}
}
