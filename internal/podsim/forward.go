package podsim

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
)

// forwarder forwards TCP from a pod's ip:port to where its process really listens.
type forwarder struct {
	ln     net.Listener
	target string
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func listenForward(ip string, port int32, target string) (*forwarder, error) {
	addr := net.JoinHostPort(ip, strconv.Itoa(int(port)))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("forwarding %s to %s: %w", addr, target, err)
	}
	f := &forwarder{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	return f, nil
}

// serve accepts until close; wg counts the caller, so it may count the connections too.
func (f *forwarder) serve(wg *sync.WaitGroup) {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.pipe(c)
		}()
	}
}

func (f *forwarder) pipe(c net.Conn) {
	var d net.Dialer
	up, err := d.DialContext(f.ctx, "tcp", f.target)
	if err != nil {
		c.Close()
		return
	}
	if !f.track(c, up) {
		c.Close()
		up.Close()
		return
	}
	defer f.untrack(c, up)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, c)
		closeWrite(up)
	}()
	_, _ = io.Copy(c, up)
	closeWrite(c)
	<-done
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	_ = c.Close()
}

func (f *forwarder) track(cs ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	for _, c := range cs {
		f.conns[c] = struct{}{}
	}
	return true
}

func (f *forwarder) untrack(cs ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(f.conns, c)
	}
}

// close stops listening and closes every forwarded connection.
func (f *forwarder) close() {
	f.cancel()
	f.ln.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	clear(f.conns)
}
