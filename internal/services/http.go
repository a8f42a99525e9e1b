package services

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// HTTPServer serves Handler on Listener as a manager.Runnable: every crdipc HTTP server
// (webhook, metrics agent, CSI probes and metrics) starts and shuts down this one way.
type HTTPServer struct {
	Name     string
	Listener net.Listener
	Handler  http.Handler
	// ShutdownTimeout is how long requests in flight get when the manager stops; default 10 s.
	ShutdownTimeout time.Duration
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every replica serves.
func (s *HTTPServer) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable.
func (s *HTTPServer) Start(ctx context.Context) error {
	srv := &http.Server{
		Handler:           s.Handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(s.Listener) }()
	select {
	case err := <-errc:
		return fmt.Errorf("%s: serving on %s: %w", s.Name, s.Listener.Addr(), err)
	case <-ctx.Done():
	}
	timeout := s.ShutdownTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("%s: shutting down: %w", s.Name, err)
	}
	return nil
}

// runnableFunc is a manager.Runnable that runs on every replica (no leader).
type runnableFunc func(context.Context) error

func (f runnableFunc) Start(ctx context.Context) error { return f(ctx) }
func (f runnableFunc) NeedLeaderElection() bool        { return false }
