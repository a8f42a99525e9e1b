// Package s3server runs a real S3 server for tests: versitygw, its posix backend serving
// a directory of the test's, on a loopback port. Buckets are directories and objects
// files there, so a test can read, damage or remove an object from outside S3.
package s3server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/require"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// Module is the versitygw release hack/test-deps.sh installs (go install).
const Module = "github.com/versity/versitygw/cmd/versitygw@v1.8.0"

// RequireEnv makes a missing versitygw a failure instead of a skip (CI sets it).
const RequireEnv = "CRDIPC_REQUIRE_S3"

// Server is a running S3 server.
type Server struct {
	// Endpoint is host:port, plain HTTP.
	Endpoint             string
	AccessKey, SecretKey string
	// Dir holds the buckets: bucket b's object k is the file Dir/b/k.
	Dir string
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
		return "", fmt.Errorf("versitygw is not installed: run `go install %s` (make test-deps does)", Module)
	}
	return p, nil
}

// Start runs a server until the test ends, and waits until it answers. Without versitygw
// the test skips, or fails under CRDIPC_REQUIRE_S3=1.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Find()
	require.Capable(t, RequireEnv, err)
	dir := t.TempDir()
	s := &Server{Dir: filepath.Join(dir, "buckets"), AccessKey: "crdipc-test", SecretKey: randomHex(t, 20)}
	for _, d := range []string{s.Dir, filepath.Join(dir, "meta")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.Endpoint = ln.Addr().String()
	ln.Close()
	logf, err := os.Create(filepath.Join(dir, "versitygw.log"))
	if err != nil {
		t.Fatal(err)
	}
	// Metadata in a sidecar directory: the test's file system need not have user xattrs.
	cmd := exec.Command(bin, "--access", s.AccessKey, "--secret", s.SecretKey, "--port", s.Endpoint,
		"posix", "--sidecar", filepath.Join(dir, "meta"), s.Dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting versitygw: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("versitygw log:\n%s", b)
			}
		}
		logf.Close()
	})
	wait.Eventually(t, 30*time.Second, "versitygw answering on "+s.Endpoint, func(ctx context.Context) (bool, error) {
		select {
		case <-exited:
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("versitygw exited:\n%s", b)
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Endpoint+"/", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return true, nil // any answer: unsigned requests are refused, but it serves
	})
	return s
}

func randomHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}
