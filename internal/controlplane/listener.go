package controlplane

import (
	"net"
	"sync"
)

// trackingListener remembers the connections it accepted so Stop can close
// them. kube-apiserver leaves long-running streams (watches) of its clients
// open after it stops; in its own process the exit would close them, but in
// ours they would linger and clients would wait forever on a dead server.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func newTrackingListener(ln net.Listener) *trackingListener {
	return &trackingListener{Listener: ln, conns: map[net.Conn]struct{}{}}
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, l: l}
	l.mu.Lock()
	l.conns[tc] = struct{}{}
	l.mu.Unlock()
	return tc, nil
}

// closeAll closes the listener and every connection it accepted.
func (l *trackingListener) closeAll() {
	_ = l.Listener.Close()
	l.mu.Lock()
	conns := l.conns
	l.conns = map[net.Conn]struct{}{}
	l.mu.Unlock()
	for c := range conns {
		_ = c.(*trackedConn).Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	l    *trackingListener
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}
