package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/storage/backup"
	"github.com/crdipc/crdipc/internal/storage/blockdev"
	"github.com/crdipc/crdipc/internal/testenv/require"
	"github.com/crdipc/crdipc/internal/testenv/s3server"
)

// backupStoreManifest is the BackupStore a user writes for an S3 server on endpoint, with the
// Secret s3 holding the credentials and the key.
func backupStoreManifest(endpoint, bucket string) string {
	return fmt.Sprintf(`apiVersion: storage.crdipc.io/v1alpha1
kind: BackupStore
metadata:
  name: offsite
spec:
  endpoint: http://%s
  bucket: %s
  chunkSize: 256Ki
  accessKeyID: {name: s3, key: accessKeyID}
  secretAccessKey: {name: s3, key: secretAccessKey}
  encryptionKey: {name: s3, key: key}
`, endpoint, bucket)
}

func volumeBackupManifest(name string) string {
	return fmt.Sprintf(`apiVersion: storage.crdipc.io/v1alpha1
kind: VolumeBackup
metadata:
  name: %s
  namespace: default
spec:
  store: offsite
  source:
    persistentVolumeClaimName: data
`, name)
}

// TestBackupToS3 backs a 3-replica volume of `crdipc up` up into a real S3 server, as a user
// does with kubectl: a BackupStore, then VolumeBackups of the PVC. The backup holds the
// volume's bytes; a second one after 1 % of the volume changed uploads little more than
// that; the bucket holds no plaintext. Then the cluster is destroyed, and a new one given the
// same bucket and key finds both backups.
func TestBackupToS3(t *testing.T) {
	requireKubectl(t)
	require.Capable(t, "CRDIPC_REQUIRE_MOUNT", blockdev.Available())
	srv := s3server.Start(t)
	const bucket = "crdipc-e2e"
	s3o := backup.S3Options{Endpoint: srv.Endpoint, Bucket: bucket, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, Insecure: true, CreateBucket: true}
	store, err := backup.NewS3(t.Context(), s3o)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(t.TempDir(), "key")
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	configure := func(up *upProcess) {
		up.Kubectl(t, "create", "secret", "generic", "s3", "-n", "crdipc-backup",
			"--from-literal=accessKeyID="+srv.AccessKey, "--from-literal=secretAccessKey="+srv.SecretKey, "--from-file=key="+keyFile)
		up.Apply(t, backupStoreManifest(srv.Endpoint, bucket))
		up.Kubectl(t, "wait", "--for=condition=Ready", "backupstore/offsite", "--timeout=60s")
	}

	up := startUp(t, t.TempDir(), "--nodes", "3")
	up.Kubectl(t, "apply", "-f", "../../config/samples/csi/storage_v1alpha1_storagepoolclaim.yaml")
	up.Kubectl(t, "apply", "-f", "../../config/samples/csi/pvc.yaml")
	up.Kubectl(t, "wait", "--for=jsonpath={.status.phase}=Bound", "pvc/data", "--timeout=60s")
	volume := up.Kubectl(t, "get", "pvc", "data", "-o", "jsonpath={.spec.volumeName}")
	configure(up)

	// 40 MiB that do not compress, and 8 MiB of a line that can be searched for.
	marker := fmt.Sprintf("crdipc-backup-e2e-%d", time.Now().UnixNano())
	up.Apply(t, busyboxPod("writer", "node-1", fmt.Sprintf(
		"head -c 41943040 /dev/urandom > /data/random && yes %s | head -c 8388608 > /data/pattern && sync", marker)))
	up.waitPodSucceeded(t, "writer")
	up.Kubectl(t, "delete", "pod", "writer", "--wait=true", "--timeout=60s")
	up.Eventually(t, time.Minute, "three identical replica files holding the data", up.replicasIdentical(t, volume, 3, marker))

	backedUp := func(name string) (uploaded int64) {
		t.Helper()
		up.Apply(t, volumeBackupManifest(name))
		up.Kubectl(t, "wait", "--for=jsonpath={.status.phase}=Completed", "volumebackup/"+name, "--timeout=180s")
		out := up.Kubectl(t, "get", "volumebackup", name, "-o", "jsonpath={.status.bytesUploaded} {.status.backupID} {.status.volume}")
		f := strings.Fields(out)
		if len(f) != 3 || f[2] != "default/data" {
			t.Fatalf("volumebackup %s status: %q", name, out)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		// The backup holds the volume's bytes: restored from the bucket, outside the cluster,
		// they are a replica's.
		repo, err := backup.OpenExisting(t.Context(), store, key)
		if err != nil {
			t.Fatal(err)
		}
		restored, err := os.Create(filepath.Join(t.TempDir(), name))
		if err != nil {
			t.Fatal(err)
		}
		defer restored.Close()
		if _, err := repo.Restore(t.Context(), f[1], restored, backup.RestoreOptions{}); err != nil {
			t.Fatalf("restoring backup %s: %v", name, err)
		}
		replica := strings.Fields(up.Kubectl(t, "get", "cv", "-n", "crdipc-system", volume, "-o", "jsonpath={.status.replicas[0].location}"))[0]
		if got, want := fileSum(t, restored.Name()), fileSum(t, replica); got != want {
			t.Fatalf("backup %s does not hold the volume's bytes: restored sha256 %x, the replica file %s's %x", name, got, replica, want)
		}
		// The snapshot taken for it is gone once it is complete.
		up.Eventually(t, 30*time.Second, "the backup's VolumeSnapshot deleted", func(context.Context) (bool, error) {
			out, err := up.Run("kubectl", "get", "volumesnapshot", "backup-"+name)
			return err != nil && strings.Contains(out, "NotFound"), nil
		})
		return n
	}
	first := backedUp("first")
	const size = 64 << 20
	if first < 40<<20 {
		t.Errorf("the first backup uploaded %d bytes, less than the volume's random data", first)
	}

	// 1 % of the volume changes.
	up.Apply(t, busyboxPod("changer", "node-2", "dd if=/dev/urandom of=/data/random bs=4096 count=164 seek=2560 conv=notrunc,fsync"))
	up.waitPodSucceeded(t, "changer")
	up.Kubectl(t, "delete", "pod", "changer", "--wait=true", "--timeout=60s")
	second := backedUp("second")
	t.Logf("a backup after 1 %% of the volume changed uploaded %d bytes, %.2f %% of the volume", second, 100*float64(second)/size)
	if second > size*2/100 {
		t.Errorf("a backup after 1 %% of the volume changed uploaded %d bytes, more than 2 %% of %d", second, size)
	}
	out := up.Kubectl(t, "get", "volumebackups")
	for _, want := range []string{"STORE", "PHASE", "UPLOADED", "first", "second", "Completed"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl get volumebackups does not show %s:\n%s", want, out)
		}
	}
	if ev := up.Kubectl(t, "get", "events", "--field-selector", "involvedObject.kind=VolumeBackup,involvedObject.name=second", "-o", "jsonpath={.items[*].reason}"); !strings.Contains(ev, "Succeeded") {
		t.Errorf("no Succeeded Event for the backup: %q", ev)
	}

	// No object of the bucket holds the data, the volume's name or the credentials.
	err = filepath.WalkDir(filepath.Join(srv.Dir, bucket), func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, s := range []string{marker, volume, srv.SecretKey} {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s holds %q in plaintext", path, s)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// The cluster is lost; a new one is given the bucket and the key.
	up.Stop(t)
	again := startUp(t, t.TempDir(), "--nodes", "3")
	configure(again)
	for _, name := range []string{"first", "second"} {
		again.Eventually(t, time.Minute, "backup "+name+" found in the bucket", func(context.Context) (bool, error) {
			out, err := again.Run("kubectl", "get", "volumebackup", name, "-o", "jsonpath={.status.phase} {.status.volume}")
			if err != nil || out != "Completed default/data" {
				return false, fmt.Errorf("%s: %v", out, err)
			}
			return true, nil
		})
	}
}

// fileSum is the sha256 of a file's bytes, the zeros of its holes included.
func fileSum(t *testing.T, path string) [sha256.Size]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}
