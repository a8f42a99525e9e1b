package realnode

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/storage/backup"
	"github.com/crdipc/crdipc/internal/testenv/s3server"
)

// testBackup backs claim data (testVolume's, holding the blob) up into an S3 server on the
// host's address the nodes reach, with config/samples/backup as a user applies it: the
// operator's pod opens the store, the pool agent's pod on the replica's node reads the
// snapshot copy and uploads it. A claim restored from the backup holds the blob, read by a
// pod on a real node.
func (c *cluster) testBackup(t *testing.T, blob string) {
	srv := s3server.StartOn(t, advertise)
	const bucket = "crdipc-realnode"
	if _, err := backup.NewS3(t.Context(), backup.S3Options{Endpoint: srv.Endpoint, Bucket: bucket,
		AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, Insecure: true, CreateBucket: true}); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(t.TempDir(), "backup.key")
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	if err := os.WriteFile(key, b, 0o600); err != nil {
		t.Fatal(err)
	}
	c.kubectl(t, "create", "secret", "generic", "s3", "-n", "crdipc-backup",
		"--from-literal=accessKeyID="+srv.AccessKey, "--from-literal=secretAccessKey="+srv.SecretKey, "--from-file=key="+key)
	sample := func(name string, oldnew ...string) string {
		data, err := os.ReadFile(filepath.Join(root, "config/samples", name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.NewReplacer(oldnew...).Replace(string(data))
	}
	c.apply(t, sample("storage_v1alpha1_backupstore.yaml", "127.0.0.1:7070", srv.Endpoint, "crdipc-backups", bucket))
	c.wait(t, 2*time.Minute, "--for=condition=Ready", "backupstore/offsite")
	c.apply(t, sample("storage_v1alpha1_volumebackup.yaml"))
	c.wait(t, 5*time.Minute, "--for=jsonpath={.status.phase}=Completed", "volumebackup/data-backup")
	t.Logf("backup: %s", c.kubectl(t, "get", "volumebackup", "data-backup", "-o", "wide"))
	if node := c.kubectl(t, "get", "volumebackup", "data-backup", "-o", "jsonpath={.status.node}"); !strings.HasPrefix(node, "real-") {
		t.Errorf("the backup was uploaded by node %q, not a real node's agent", node)
	}

	c.apply(t, sample("backup/pvc-from-backup.yaml"))
	c.wait(t, 5*time.Minute, "--for=jsonpath={.status.phase}=Bound", "pvc/data-from-backup")
	c.apply(t, podWithClaim("restored-reader", "", "busybox", "data-from-backup", "sha256sum", "/data/blob"))
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Succeeded", "pod/restored-reader")
	if read := strings.Fields(c.kubectl(t, "logs", "restored-reader")); len(read) == 0 || read[0] != blob {
		t.Errorf("the claim restored from the backup holds %v, the backed-up blob %s", read, blob)
	}
	c.kubectl(t, "delete", "pod", "restored-reader", "--wait=true")
	c.kubectl(t, "delete", "pvc", "data-from-backup", "--wait=true")
	c.kubectl(t, "delete", "volumebackup", "data-backup", "--wait=true")
	c.kubectl(t, "delete", "backupstore", "offsite", "--wait=true")
}
