package agent

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/storage/backup"
	"github.com/crdipc/crdipc/internal/storage/replica"
	"github.com/crdipc/crdipc/internal/testenv/s3server"
)

// An upload writes its progress into the VolumeBackup from a goroutine of its own while the
// upload goes on, and its last step (Commit: is the backup still wanted?) asks after the same
// backup: Commit's read is held here until a progress write has ended, so the two meet, and
// the upload must still complete with its status right. Commit asks by the backup's key and
// UID, taken before the goroutine starts, never through the object the goroutine writes. The
// race detector did not report the earlier Commit's reads of that object in this test (it
// takes any socket write followed by any socket read, and much else, for synchronization);
// the cluster is a fake client to leave it as few such edges as possible.
func TestBackupProgressBesideCommit(t *testing.T) {
	ctx := t.Context()
	srv := s3server.Start(t)
	bucket, key := "bucket", make([]byte, 32)
	_, _ = rand.Read(key)
	st, err := backup.NewS3(ctx, backup.S3Options{Endpoint: srv.Endpoint, Bucket: bucket, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, Insecure: true, CreateBucket: true})
	if err != nil {
		t.Fatal(err)
	}
	const chunk = 64 << 10
	if _, err := backup.Open(ctx, st, key, backup.InitOptions{ChunkSize: chunk}); err != nil {
		t.Fatal(err)
	}

	// A snapshot whose copy, four chunks of random data, is beside a replica of this node.
	const node = "node-backup"
	location := filepath.Join(t.TempDir(), "replica")
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: storagev1alpha1.BackupNamespace, Name: "s3"},
		Data:       map[string][]byte{"accessKeyID": []byte(srv.AccessKey), "secretAccessKey": []byte(srv.SecretKey), "key": key},
	}
	store := &storagev1alpha1.BackupStore{
		ObjectMeta: metav1.ObjectMeta{Name: "store"},
		Spec: storagev1alpha1.BackupStoreSpec{
			Endpoint: "http://" + srv.Endpoint, Bucket: bucket,
			AccessKeyID:     storagev1alpha1.SecretKeyRef{Name: secret.Name, Key: "accessKeyID"},
			SecretAccessKey: storagev1alpha1.SecretKeyRef{Name: secret.Name, Key: "secretAccessKey"},
			EncryptionKey:   storagev1alpha1.SecretKeyRef{Name: secret.Name, Key: "key"},
		},
	}
	r := &storagev1alpha1.CStorVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: "replica"},
		Spec:       storagev1alpha1.CStorVolumeReplicaSpec{Volume: "volume", Pool: "pool", NodeName: node, Capacity: resource.MustParse("1Mi")},
		Status:     storagev1alpha1.CStorVolumeReplicaStatus{Location: location},
	}
	data := make([]byte, 4*chunk)
	_, _ = rand.Read(data)
	snap := &storagev1alpha1.CStorVolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: "snapshot", UID: "snapshot-uid"},
		Spec:       storagev1alpha1.CStorVolumeSnapshotSpec{Volume: "volume"},
		Status: storagev1alpha1.CStorVolumeSnapshotStatus{Size: resource.NewQuantity(int64(len(data)), resource.BinarySI),
			Copies: []storagev1alpha1.SnapshotCopy{{Replica: r.Name, Node: node}}},
	}
	file, _ := replica.SnapshotFiles(location, string(snap.UID))
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	b := &storagev1alpha1.VolumeBackup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "backup", UID: "backup-uid"},
		Spec:       storagev1alpha1.VolumeBackupSpec{Store: store.Name},
		Status: storagev1alpha1.VolumeBackupStatus{Phase: storagev1alpha1.BackupUploading, BackupID: "backup-uid",
			Snapshot: snap.Name, Volume: "default/data", Node: node},
	}
	base := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(secret, store, r, snap, b).
		WithStatusSubresource(&storagev1alpha1.VolumeBackup{}).Build()

	// Commit reads the backup from live: that read waits for the next progress write to end.
	var (
		mu      sync.Mutex
		waiting chan struct{} // closed by the first progress write that ends after it was made
	)
	c := interceptor.NewClient(base, interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			err := c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			mu.Lock()
			if waiting != nil {
				close(waiting)
				waiting = nil
			}
			mu.Unlock()
			return err
		},
	})
	live := interceptor.NewClient(base, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*storagev1alpha1.VolumeBackup); ok {
				ch := make(chan struct{})
				mu.Lock()
				waiting = ch
				mu.Unlock()
				select {
				case <-ch:
				case <-time.After(10 * time.Second):
					t.Error("no progress written within 10 s of the upload's end")
				}
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})

	u := &backupUploader{node: node, c: c, live: live, log: logr.Discard()}
	if err := u.upload(ctx, b.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	if err := base.Get(ctx, client.ObjectKeyFromObject(b), b); err != nil {
		t.Fatal(err)
	}
	if b.Status.CompletionTime == nil || b.Status.BytesDone != int64(len(data)) {
		t.Errorf("status after the upload: completion %v, %d of %d bytes done", b.Status.CompletionTime, b.Status.BytesDone, len(data))
	}
}
