package replica

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A peer that vanished without closing its connection (its node lost, its link cut: no FIN,
// no RST ever comes) is found dead after deadPeerAfter instead of the kernel's two hours (or
// Go's 2.5 min) when the connection is idle (keepAlive: probes after 5 s of silence, every
// 2 s, 3 unanswered), and the same when a reply to it goes unacknowledged (TCP_USER_TIMEOUT,
// on Linux). The connection then closes, and with it the writer session it held, so the
// volume's target on another node can open the replica; the lost writer can no longer write
// through it (the session is exclusive: it is fenced).
var keepAlive = net.KeepAliveConfig{Enable: true, Idle: 5 * time.Second, Interval: 2 * time.Second, Count: 3}

// deadPeerAfter is when an idle connection's last probe goes unanswered: 11 s.
var deadPeerAfter = keepAlive.Idle + time.Duration(keepAlive.Count)*keepAlive.Interval

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
	_ = tc.SetKeepAliveConfig(keepAlive)
	if rc, err := tc.SyscallConn(); err == nil {
		_ = setUserTimeout(rc)
	}
}
