package s3local_test

import (
	"os"
	"strings"
	"testing"

	"github.com/crdipc/crdipc/internal/storage/backup/s3local"
)

// The release the tests name is the one make test-deps installs.
func TestModuleIsTheOneTestDepsInstalls(t *testing.T) {
	script, err := os.ReadFile("../../../../hack/test-deps.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), "versitygw:"+s3local.Module) {
		t.Fatalf("hack/test-deps.sh does not install versitygw:%s", s3local.Module)
	}
}
