package s3server_test

import (
	"os"
	"strings"
	"testing"

	"github.com/crdipc/crdipc/internal/testenv/s3server"
)

// The release the tests name is the one make test-deps installs.
func TestModuleIsTheOneTestDepsInstalls(t *testing.T) {
	script, err := os.ReadFile("../../../hack/test-deps.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), "versitygw:"+s3server.Module) {
		t.Fatalf("hack/test-deps.sh does not install versitygw:%s", s3server.Module)
	}
}
