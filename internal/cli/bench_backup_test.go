package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/crdipc/crdipc/internal/bench"
	"github.com/crdipc/crdipc/internal/storage/backup/s3local"
	"github.com/crdipc/crdipc/internal/testenv/require"
	"github.com/crdipc/crdipc/internal/testenv/s3server"
)

// bench backup at a small size, as a user runs it: every figure measured and the restore
// identical. How fast is the full-size run's to report; this machine may be busy.
func TestBenchBackup(t *testing.T) {
	_, err := s3local.Find()
	require.Capable(t, s3server.RequireEnv, err)
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "backup.json")
	cmd := newBenchCommand()
	var out, stderr bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"backup", "--dir", dir, "--size", "64Mi", "--chunk-size", "1048576", "--json", jsonPath})
	if err := cmd.ExecuteContext(t.Context()); err != nil {
		t.Fatalf("bench backup: %v\n%s\n%s", err, out.String(), stderr.String())
	}
	t.Logf("\n%s", out.String())
	data, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var b bench.Backup
	if err := json.Unmarshal(data, &b); err != nil {
		t.Fatal(err)
	}
	if !b.Identical || b.PutMiBps <= 0 || b.GetMiBps <= 0 || b.BackupMiBps <= 0 || b.RestoreMiBps <= 0 || b.Objects < 64 || b.IncrementalBytes <= 0 {
		t.Fatalf("figures missing: %+v", b)
	}
	if !strings.Contains(stderr.String(), "backup: 64 of 64 MiB") || !strings.Contains(stderr.String(), "restore: 64 of 64 MiB") {
		t.Fatalf("no progress printed:\n%s", stderr.String())
	}
}
