package controlplane

import (
	"errors"
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

// joinedListener accepts on several listeners as one: the API server's loopback address
// and its advertise address share one server. Addr is the first listener's.
type joinedListener struct {
	ls    []net.Listener
	conns chan acceptResult
	done  chan struct{}
	once  sync.Once
}

type acceptResult struct {
	c   net.Conn
	err error
}

func joinListeners(ls ...net.Listener) net.Listener {
	if len(ls) == 1 {
		return ls[0]
	}
	j := &joinedListener{ls: ls, conns: make(chan acceptResult), done: make(chan struct{})}
	for _, l := range ls {
		go j.serve(l)
	}
	return j
}

func (j *joinedListener) serve(l net.Listener) {
	for {
		c, err := l.Accept()
		select {
		case j.conns <- acceptResult{c, err}:
		case <-j.done:
			if c != nil {
				_ = c.Close()
			}
			return
		}
		if errors.Is(err, net.ErrClosed) {
			// A closed listener ends its loop; the error reached one Accept caller, while
			// a temporary one (too many open files) is the server's to retry.
			return
		}
	}
}

func (j *joinedListener) Accept() (net.Conn, error) {
	select {
	case r := <-j.conns:
		return r.c, r.err
	case <-j.done:
		return nil, net.ErrClosed
	}
}

func (j *joinedListener) Close() error {
	var first error
	j.once.Do(func() {
		close(j.done)
		for _, l := range j.ls {
			if err := l.Close(); err != nil && first == nil {
				first = err
			}
		}
	})
	return first
}

func (j *joinedListener) Addr() net.Addr { return j.ls[0].Addr() }
