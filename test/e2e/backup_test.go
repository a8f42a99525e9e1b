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
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/storage/backup"
	"github.com/crdipc/crdipc/internal/storage/blockdev"
	"github.com/crdipc/crdipc/internal/storage/storeref"
	"github.com/crdipc/crdipc/internal/testenv/metrics"
	"github.com/crdipc/crdipc/internal/testenv/podmanifest"
	"github.com/crdipc/crdipc/internal/testenv/require"
	"github.com/crdipc/crdipc/internal/testenv/s3server"
)

// sample returns a file of config/samples with replacements made (old, new, ...).
func sample(t *testing.T, name string, oldnew ...string) string {
	t.Helper()
	return strings.NewReplacer(oldnew...).Replace(readFile(t, filepath.Join("../../config/samples", name)))
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
	// As secret.yaml says to make it, and the sample store on this S3 server with chunks of
	// 256Ki (a 64Mi volume is small).
	configure := func(up *upProcess) {
		up.Kubectl(t, "create", "secret", "generic", "s3", "-n", "crdipc-backup",
			"--from-literal=accessKeyID="+srv.AccessKey, "--from-literal=secretAccessKey="+srv.SecretKey, "--from-file=key="+keyFile)
		up.Apply(t, sample(t, "storage_v1alpha1_backupstore.yaml", "127.0.0.1:7070", srv.Endpoint, "crdipc-backups", bucket, "  retention:", "  chunkSize: 256Ki\n  retention:"))
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
		"head -c 41943040 /dev/urandom > /data/random && yes %s | head -c 8388608 > /data/pattern && cd /data && sha256sum random pattern > sums && sync", marker)))
	up.waitPodSucceeded(t, "writer")
	up.Kubectl(t, "delete", "pod", "writer", "--wait=true", "--timeout=60s")
	up.Eventually(t, time.Minute, "three identical replica files holding the data", up.replicasIdentical(t, volume, 3, marker))

	backedUp := func(name string) (uploaded int64) {
		t.Helper()
		up.Apply(t, sample(t, "storage_v1alpha1_volumebackup.yaml", "name: data-backup", "name: "+name))
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
		m, err := repo.Restore(t.Context(), f[1], restored, backup.RestoreOptions{})
		if err != nil {
			t.Fatalf("restoring backup %s: %v", name, err)
		}
		if err := restored.Truncate(m.Size); err != nil { // zero chunks at the end are not written
			t.Fatal(err)
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
	first := backedUp("data-backup")
	const size = 64 << 20
	if first < 40<<20 {
		t.Errorf("the first backup uploaded %d bytes, less than the volume's random data", first)
	}

	// 1 % of the volume changes.
	up.Apply(t, busyboxPod("changer", "node-2", "dd if=/dev/urandom of=/data/random bs=4096 count=164 seek=2560 conv=notrunc,fsync && cd /data && sha256sum random pattern > sums && sync"))
	up.waitPodSucceeded(t, "changer")
	up.Kubectl(t, "delete", "pod", "changer", "--wait=true", "--timeout=60s")
	second := backedUp("data-backup-2")
	t.Logf("a backup after 1 %% of the volume changed uploaded %d bytes, %.2f %% of the volume", second, 100*float64(second)/size)
	if second > size*2/100 {
		t.Errorf("a backup after 1 %% of the volume changed uploaded %d bytes, more than 2 %% of %d", second, size)
	}
	out := up.Kubectl(t, "get", "volumebackups")
	for _, want := range []string{"STORE", "PHASE", "UPLOADED", "data-backup-2", "Completed"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl get volumebackups does not show %s:\n%s", want, out)
		}
	}
	if ev := up.Kubectl(t, "get", "events", "--field-selector", "involvedObject.kind=VolumeBackup,involvedObject.name=data-backup-2", "-o", "jsonpath={.items[*].reason}"); !strings.Contains(ev, "Succeeded") {
		t.Errorf("no Succeeded Event for the backup: %q", ev)
	}

	// The agents count what they read and uploaded, by store, on the services' /metrics.
	addr := regexp.MustCompile(`(?m)^\s*metrics\s+http://(\S+)/metrics`).FindStringSubmatch(up.Output.String())
	if addr == nil {
		t.Fatalf("up printed no metrics address:\n%s", up.Output.String())
	}
	mfs := metrics.Scrape(t, "http://"+addr[1]+"/metrics")
	if n := mfs.Sum("crdipc_backups_total", map[string]string{"store": "offsite", "result": "completed"}); n < 2 {
		t.Errorf("crdipc_backups_total{store=offsite,result=completed} = %v after two backups:\n%s", n, mfs.Format("crdipc_backups_total"))
	}
	if n := mfs.Sum("crdipc_backup_read_bytes_total", map[string]string{"store": "offsite"}); n < 2*40<<20 {
		t.Errorf("crdipc_backup_read_bytes_total{store=offsite} = %v after two backups of 40 MiB and more", n)
	}
	if n := mfs.Sum("crdipc_backup_uploaded_bytes_total", map[string]string{"store": "offsite"}); n < float64(first+second) {
		t.Errorf("crdipc_backup_uploaded_bytes_total{store=offsite} = %v, less than the %d bytes the backups report", n, first+second)
	}

	// A backup deleted while it uploads, its policy Delete: the deletion waits for the upload
	// to stop, and the bucket is left with no manifest of it, which the store's next sync
	// would make a VolumeBackup again.
	up.Apply(t, sample(t, "storage_v1alpha1_volumebackup.yaml", "name: data-backup", "name: data-backup-deleted", "  source:", "  deletionPolicy: Delete\n  source:"))
	up.Eventually(t, time.Minute, "the backup to delete uploading", func(context.Context) (bool, error) {
		out, _ := up.Run("kubectl", "get", "volumebackup", "data-backup-deleted", "-o", "jsonpath={.status.phase}")
		if out != "Uploading" && out != "Completed" {
			return false, fmt.Errorf("phase %q", out)
		}
		return true, nil
	})
	up.Kubectl(t, "delete", "volumebackup", "data-backup-deleted", "--wait=true", "--timeout=120s")
	if repo, err := backup.OpenExisting(t.Context(), store, key); err != nil {
		t.Fatal(err)
	} else if list, err := repo.Backups(t.Context()); err != nil {
		t.Fatal(err)
	} else {
		for _, m := range list {
			if m.Labels[storeref.ManifestName] == "data-backup-deleted" {
				t.Errorf("backup %s, deleted with policy Delete while it uploaded, is in the bucket", m.ID)
			}
		}
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

	firstID := up.Kubectl(t, "get", "volumebackup", "data-backup", "-o", "jsonpath={.status.backupID}")
	secondID := up.Kubectl(t, "get", "volumebackup", "data-backup-2", "-o", "jsonpath={.status.backupID}")

	// The cluster is lost; a new one is given the bucket and the key.
	up.Stop(t)
	again := startUp(t, t.TempDir(), "--nodes", "3")
	again.Kubectl(t, "apply", "-f", "../../config/samples/csi/storage_v1alpha1_storagepoolclaim.yaml")
	configure(again)
	for _, name := range []string{"data-backup", "data-backup-2"} {
		again.Eventually(t, time.Minute, "backup "+name+" found in the bucket", func(context.Context) (bool, error) {
			out, err := again.Run("kubectl", "get", "volumebackup", name, "-o", "jsonpath={.status.phase} {.status.volume}")
			if err != nil || out != "Completed default/data" {
				return false, fmt.Errorf("%s: %v", out, err)
			}
			return true, nil
		})
	}
	// A claim restores the first backup (the sample); a pod checks the files against the
	// sums taken when it was made.
	again.Kubectl(t, "apply", "-f", "../../config/samples/backup/pvc-from-backup.yaml")
	again.Kubectl(t, "wait", "--for=jsonpath={.status.phase}=Bound", "pvc/data-from-backup", "--timeout=180s")
	check := podmanifest.Shell("checker", "busybox:1.36", "cd /data && sha256sum -c sums")
	check.Hostname, check.Claim = "node-3", "data-from-backup"
	again.Apply(t, check.Manifest())
	again.waitPodSucceeded(t, "checker")

	// A chunk that only the second backup holds (what changed) is damaged in the bucket: a
	// claim restoring the second backup is refused, naming the chunk; the first is unharmed.
	repo, err := backup.OpenExisting(t.Context(), store, key)
	if err != nil {
		t.Fatal(err)
	}
	m1, err := repo.Manifest(t.Context(), firstID)
	if err != nil {
		t.Fatal(err)
	}
	m2, err := repo.Manifest(t.Context(), secondID)
	if err != nil {
		t.Fatal(err)
	}
	damaged := ""
	for _, c := range m2.Chunks {
		if c != "" && !slices.Contains(m1.Chunks, c) {
			damaged = c
		}
	}
	if damaged == "" {
		t.Fatal("the second backup shares every chunk with the first")
	}
	if out, err := again.Run(binary, "backup", "verify", "offsite"); err != nil || !strings.Contains(out, "2 backups") || !strings.Contains(out, "every chunk reads back") {
		t.Errorf("crdipc backup verify of an intact store: %v\n%s", err, out)
	}
	// Its copy: chunks/ab/<name>, or <name>.<epoch> once a prune made an epoch.
	copies, err := filepath.Glob(filepath.Join(srv.Dir, bucket, "chunks", damaged[:2], damaged+"*"))
	if err != nil || len(copies) != 1 {
		t.Fatalf("copies of chunk %s in the bucket: %v, %v; want one", damaged, copies, err)
	}
	obj := copies[0]
	b, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(obj, b, 0o644); err != nil {
		t.Fatal(err)
	}
	again.Apply(t, sample(t, "backup/pvc-from-backup.yaml", "name: data-from-backup", "name: data-damaged", "name: data-backup", "name: data-backup-2"))
	again.Eventually(t, 2*time.Minute, "the restore of the damaged backup refused, naming the chunk", func(context.Context) (bool, error) {
		out := again.Kubectl(t, "get", "cvr", "-n", "crdipc-system", "-o", `jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].message}{"\n"}{end}`)
		if !strings.Contains(out, damaged) {
			return false, fmt.Errorf("replica messages:\n%s", out)
		}
		return true, nil
	})
	if phase := again.Kubectl(t, "get", "pvc", "data-damaged", "-o", "jsonpath={.status.phase}"); phase != "Pending" {
		t.Errorf("a claim restoring a damaged backup is %s, want Pending", phase)
	}
	out, err = again.Run(binary, "backup", "verify", "offsite")
	if err == nil || !strings.Contains(out, damaged) || !strings.Contains(out, "default/data-backup-2") || strings.Contains(out, "default/data-backup ") {
		t.Errorf("crdipc backup verify after a chunk of data-backup-2 was damaged: %v\n%s", err, out)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
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
