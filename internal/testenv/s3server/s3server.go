// Package s3server runs a real S3 server for a test (package s3local: versitygw on
// loopback, serving a directory of the test's), so that a test can also read, damage or
// remove an object from outside S3.
package s3server

import (
	"os"
	"testing"

	"github.com/crdipc/crdipc/internal/storage/backup/s3local"
	"github.com/crdipc/crdipc/internal/testenv/require"
)

// RequireEnv makes a missing versitygw a failure instead of a skip (CI sets it).
const RequireEnv = "CRDIPC_REQUIRE_S3"

// Start runs a server until the test ends. Without versitygw the test skips, or fails
// under CRDIPC_REQUIRE_S3=1.
func Start(t testing.TB) *s3local.Server {
	t.Helper()
	return StartOn(t, "127.0.0.1")
}

// StartOn is Start on an address of host, an IP of this machine (s3local.StartOn).
func StartOn(t testing.TB, host string) *s3local.Server {
	t.Helper()
	return StartIn(t, t.TempDir(), host)
}

// StartIn is StartOn serving dir: a server started again in the same dir serves the same
// buckets (on a new port, with new credentials).
func StartIn(t testing.TB, dir, host string) *s3local.Server {
	t.Helper()
	_, err := s3local.Find()
	require.Capable(t, RequireEnv, err)
	s, err := s3local.StartOn(t.Context(), dir, host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			if b, err := os.ReadFile(s.Log); err == nil {
				t.Logf("versitygw log:\n%s", b)
			}
		}
	})
	return s
}
