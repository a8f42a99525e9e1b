package realnode

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/crdipc/crdipc/internal/storage/backup"
	"github.com/crdipc/crdipc/internal/storage/backup/s3local"
	"github.com/crdipc/crdipc/internal/testenv/s3server"
)

// offsite is what outlives the cluster: an S3 server's bucket (versitygw serving a directory
// of the test's, on the host's address the nodes reach) and the store's encryption key.
type offsite struct {
	dir    string // versitygw's, kept when it restarts
	srv    *s3local.Server
	bucket string
	key    string // the encryption key's file
	// sums is `sha256sum` of the volume's files as the last backup has them.
	sums string
}

func startOffsite(t *testing.T) *offsite {
	t.Helper()
	o := &offsite{dir: t.TempDir(), bucket: "crdipc-realnode", key: filepath.Join(t.TempDir(), "backup.key")}
	o.srv = s3server.StartIn(t, o.dir, advertise)
	if _, err := backup.NewS3(t.Context(), backup.S3Options{Endpoint: o.srv.Endpoint, Bucket: o.bucket,
		AccessKey: o.srv.AccessKey, SecretKey: o.srv.SecretKey, Insecure: true, CreateBucket: true}); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	if err := os.WriteFile(o.key, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return o
}

// restart stops the S3 server and starts it again on the same directory: a new port and new
// credentials, the same bucket.
func (o *offsite) restart(t *testing.T) {
	t.Helper()
	o.srv.Stop()
	o.srv = s3server.StartIn(t, o.dir, advertise)
}

// openStore gives the cluster the store as a user does: the Secret of
// config/samples/backup/secret.yaml's keys, and the BackupStore sample pointed at the
// server, Ready.
func (c *cluster) openStore(t *testing.T, o *offsite) {
	t.Helper()
	c.kubectl(t, "create", "secret", "generic", "s3", "-n", "crdipc-backup",
		"--from-literal=accessKeyID="+o.srv.AccessKey, "--from-literal=secretAccessKey="+o.srv.SecretKey, "--from-file=key="+o.key)
	c.apply(t, sample(t, "storage_v1alpha1_backupstore.yaml", "127.0.0.1:7070", o.srv.Endpoint, "crdipc-backups", o.bucket))
	c.wait(t, 2*time.Minute, "--for=condition=Ready", "backupstore/offsite")
}

// sample is config/samples/name with the replacements oldnew (strings.NewReplacer's pairs).
func sample(t *testing.T, name string, oldnew ...string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "config/samples", name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.NewReplacer(oldnew...).Replace(string(data))
}

// testBackup, docs/backup.md's acceptance on real nodes up to the disaster: a pod on real-1
// writes 256 MiB of random data to a 3-replica claim, and it is backed up with the samples
// (the operator's pod takes the snapshot; a real node's pool-agent pod reads its copy,
// encrypts and uploads it). The agent uploading it is SIGKILLed from the host while it
// runs: the backup is not Completed until its restarted agent finished it. Then 1 % of the
// volume is rewritten, and the second backup uploads at most 2 % of the volume. The files'
// sums at that backup are what testRecovery checks in a new cluster.
func (c *cluster) testBackup(t *testing.T, o *offsite) {
	c.openStore(t, o)
	c.threeReplicaClaim(t, "dr", "320Mi")
	on := nodeN(1)
	c.runOnClaim(t, "dr-writer", on, "dr", "dd if=/dev/urandom of=/data/blob bs=1M count=256 2>/dev/null && sha256sum /data/blob > /data/sums && sync")

	c.apply(t, sample(t, "storage_v1alpha1_volumebackup.yaml", "name: data-backup", "name: dr-1", "persistentVolumeClaimName: data", "persistentVolumeClaimName: dr"))
	var node, seen string
	c.poll(t, 3*time.Minute, "backup dr-1 uploading", func() (bool, string) {
		out := c.kubectl(t, "get", "volumebackup", "dr-1", "-o", "jsonpath={.status.phase} {.status.node} {.status.bytesDone}")
		f := strings.Fields(out)
		if len(f) >= 2 && f[0] == "Uploading" {
			node, seen = f[1], out
			return true, out
		}
		return false, out
	})
	uploader := realNode{name: node}
	for _, n := range c.joined {
		if n.name == node {
			uploader = n
		}
	}
	c.killRestarted(t, uploader, "crdipc-pool-agent", "pool-agent")
	t.Logf("pool agent of %s SIGKILLed while backup dr-1 was %q", node, seen)
	c.wait(t, 5*time.Minute, "--for=jsonpath={.status.phase}=Completed", "volumebackup/dr-1")
	full := c.backupStatus(t, "dr-1")
	if full.done != full.size {
		t.Errorf("backup dr-1 is Completed with %d of %d bytes read", full.done, full.size)
	}
	t.Logf("backup dr-1: %s", c.kubectl(t, "get", "volumebackup", "dr-1", "-o", "wide"))

	// 1 % of the volume, in the blob's middle, then the sums again.
	c.runOnClaim(t, "dr-change", on, "dr", "dd if=/dev/urandom of=/data/blob bs=4k count=820 seek=25600 conv=notrunc 2>/dev/null && sha256sum /data/blob > /data/sums && sync")
	c.apply(t, sample(t, "storage_v1alpha1_volumebackup.yaml", "name: data-backup", "name: dr-2", "persistentVolumeClaimName: data", "persistentVolumeClaimName: dr"))
	c.wait(t, 5*time.Minute, "--for=jsonpath={.status.phase}=Completed", "volumebackup/dr-2")
	inc := c.backupStatus(t, "dr-2")
	ratio := float64(inc.uploaded) / float64(inc.size)
	t.Logf("backup dr-2 after a 1 %% change: %d bytes in %d objects uploaded, %.2f %% of the volume", inc.uploaded, inc.objects, 100*ratio)
	if ratio > 0.02 {
		t.Errorf("the backup after a 1 %% change uploaded %.2f %% of the volume, want ≤ 2 %%", 100*ratio)
	}
	o.sums = c.runOnClaim(t, "dr-sums", nodeN(3), "dr", "cat /data/sums")
	if !strings.Contains(o.sums, "/data/blob") {
		t.Fatalf("the volume's sums: %q", o.sums)
	}
}

// testRecovery, in a new cluster (a new up's data directory, the nodes joined anew,
// config/default) given the same bucket and key and nothing else: the BackupStore finds
// both backups, a claim restored from the second one (config/samples/backup's, on a
// 3-replica class) is Bound, and a pod on a real node finds the files' sums as they were.
func (c *cluster) testRecovery(t *testing.T, o *offsite) {
	c.kubectl(t, "apply", "-f", "config/samples/csi/storage_v1alpha1_storagepoolclaim.yaml")
	c.openStore(t, o)
	for _, b := range []string{"dr-1", "dr-2"} {
		c.poll(t, 3*time.Minute, "backup "+b+" found in the store", func() (bool, string) {
			out, _ := c.kc.RunFor(time.Minute, "kubectl", "get", "volumebackup", b, "-o", "jsonpath={.status.phase}")
			return out == "Completed", out
		})
	}
	t.Logf("found in the store: %s", c.kubectl(t, "get", "volumebackups", "-o", "wide"))
	c.apply(t, sample(t, "backup/pvc-from-backup.yaml", "name: data-backup", "name: dr-2", "storage: 64Mi", "storage: 320Mi"))
	c.wait(t, 10*time.Minute, "--for=jsonpath={.status.phase}=Bound", "pvc/data-from-backup")
	volume := c.kubectl(t, "get", "pvc", "data-from-backup", "-o", "jsonpath={.spec.volumeName}")
	c.volumeHealthy(t, volume, "restored")
	out := c.runOnClaim(t, "dr-check", nodeN(2), "data-from-backup", "sha256sum -c /data/sums && cat /data/sums")
	if !strings.Contains(out, "/data/blob: OK") || !strings.Contains(out, strings.TrimSpace(o.sums)) {
		t.Errorf("the restored claim: %q, the backed-up sums %q", out, o.sums)
	}
}

// runOnClaim runs script in a busybox pod on node n with claim at /data, waits for it to
// succeed, deletes it and returns its output.
func (c *cluster) runOnClaim(t *testing.T, pod string, n realNode, claim, script string) string {
	t.Helper()
	c.apply(t, podWithClaim(pod, n.name, "busybox", claim, "sh", "-c", script))
	c.wait(t, 5*time.Minute, "--for=jsonpath={.status.phase}=Succeeded", "pod/"+pod)
	out := c.kubectl(t, "logs", pod)
	c.kubectl(t, "delete", "pod", pod, "--wait=true")
	return out
}

type backupProgress struct{ size, done, uploaded, objects int64 }

func (c *cluster) backupStatus(t *testing.T, name string) backupProgress {
	t.Helper()
	out := c.kubectl(t, "get", "volumebackup", name, "-o", "jsonpath={.status.size} {.status.bytesDone} {.status.bytesUploaded} {.status.objectsUploaded}")
	f := strings.Fields(out)
	if len(f) != 4 {
		t.Fatalf("status of backup %s: %q", name, out)
	}
	size, err := resource.ParseQuantity(f[0])
	if err != nil {
		t.Fatalf("status of backup %s: %q: %v", name, out, err)
	}
	p := backupProgress{size: size.Value()}
	for i, dst := range []*int64{&p.done, &p.uploaded, &p.objects} {
		if *dst, err = strconv.ParseInt(f[i+1], 10, 64); err != nil {
			t.Fatalf("status of backup %s: %q: %v", name, out, err)
		}
	}
	return p
}
