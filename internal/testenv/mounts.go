package testenv

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/crdipc/crdipc/internal/storage/blockdev"
	"github.com/crdipc/crdipc/internal/testenv/require"
)

// RequireMounts skips t on a host that cannot present volumes as block devices (FUSE, loop
// devices, mount privilege) — or fails it when CRDIPC_REQUIRE_MOUNT=1, as CI sets: there a
// missing capability is a failure, never a silent skip.
func RequireMounts(t testing.TB) {
	t.Helper()
	require.Capable(t, "CRDIPC_REQUIRE_MOUNT", blockdev.Available())
}

// SHA256File is the hex sha256 of a file's content.
func SHA256File(t testing.TB, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// LoopDevices are the loop devices (/dev/loopN) whose backing file satisfies match, read
// from sysfs as `losetup -l` does.
func LoopDevices(t testing.TB, match func(backingFile string) bool) []string {
	t.Helper()
	backing, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		t.Fatal(err)
	}
	var devs []string
	for _, b := range backing {
		data, err := os.ReadFile(b)
		if err != nil {
			continue // detached meanwhile
		}
		if match(strings.TrimSuffix(strings.TrimSpace(string(data)), " (deleted)")) {
			devs = append(devs, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(b))))
		}
	}
	return devs
}
