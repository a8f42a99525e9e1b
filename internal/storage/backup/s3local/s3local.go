// Package s3local runs a real S3 server on this machine: versitygw (Apache-2.0), its posix
// backend serving a directory, on a loopback port. Buckets are directories and objects
// files there. It is for trying backups out, for benchmarks and for tests; a store that is
// to outlive the machine belongs elsewhere.
package s3local

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// Module is the versitygw release this package runs (go install Module).
const Module = "github.com/versity/versitygw/cmd/versitygw@v1.8.0"

// Server is a running versitygw.
type Server struct {
	// Endpoint is host:port, plain HTTP.
	Endpoint             string
	AccessKey, SecretKey string
	// Dir holds the buckets: bucket b's object k is the file Dir/b/k.
	Dir string
	// Log is versitygw's output.
	Log string

	cmd    *exec.Cmd
	exited chan struct{}
}

// Find returns the versitygw binary: on $PATH, or in $(go env GOPATH)/bin where go
// install puts it.
func Find() (string, error) {
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		if home, err := os.UserHomeDir(); err == nil {
			gopath = filepath.Join(home, "go")
		}
	}
	p := filepath.Join(gopath, "bin", "versitygw")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("versitygw is not installed: run `go install %s`", Module)
	}
	return p, nil
}

// Start runs versitygw on loopback with its buckets and metadata under dir, and waits
// (within ctx) until it answers. Stop it with Stop.
func Start(ctx context.Context, dir string) (*Server, error) { return StartOn(ctx, dir, "127.0.0.1") }

// StartOn is Start on an address of host (an IP of this machine), for clients in another
// network namespace, such as real nodes' pods.
func StartOn(ctx context.Context, dir, host string) (*Server, error) {
	bin, err := Find()
	if err != nil {
		return nil, err
	}
	secret := make([]byte, 20)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	s := &Server{Dir: filepath.Join(dir, "buckets"), AccessKey: "crdipc", SecretKey: hex.EncodeToString(secret),
		Log: filepath.Join(dir, "versitygw.log"), exited: make(chan struct{})}
	meta := filepath.Join(dir, "meta")
	for _, d := range []string{s.Dir, meta} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, err
	}
	s.Endpoint = ln.Addr().String()
	ln.Close()
	logf, err := os.Create(s.Log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	// Metadata in a sidecar directory: dir's file system need not have user xattrs.
	s.cmd = exec.Command(bin, "--access", s.AccessKey, "--secret", s.SecretKey, "--port", s.Endpoint,
		"posix", "--sidecar", meta, s.Dir)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting versitygw: %w", err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	if err := s.waitServing(ctx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// waitServing polls until the server answers HTTP: it has no readiness to watch.
func (s *Server) waitServing(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Endpoint+"/", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			return nil // any answer: an unsigned request is refused, but it serves
		}
		select {
		case <-s.exited:
			out, _ := os.ReadFile(s.Log)
			return fmt.Errorf("versitygw exited: %s", out)
		case <-ctx.Done():
			return fmt.Errorf("versitygw on %s not answering: %w", s.Endpoint, errors.Join(ctx.Err(), err))
		case <-tick.C:
		}
	}
}

// Stop ends the server (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (s *Server) Stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}
