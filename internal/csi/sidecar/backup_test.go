package sidecar_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/sidecar"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/simnode"
	"github.com/crdipc/crdipc/internal/storage/backup"
	"github.com/crdipc/crdipc/internal/storage/storeref"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/s3server"
	"github.com/crdipc/crdipc/internal/testenv/storagecluster"
)

// A claim is filled only from a backup made in its own namespace. A backup's ID is no secret
// (the UID of the VolumeBackup that made it): a user of namespace mine names, by annotation, a
// backup that namespace theirs made, and asks for a claim filled from that VolumeBackup. The
// claim stays Pending, its Events saying why, and no volume is made for it. Once the store's
// owner lets mine restore the store's backups (spec.allowedNamespaces), the same claim is
// filled from the backup and Bound. Storage, operator, driver and sidecar as in `up`, the
// store on a real S3 server.
func TestRestoreOnlyIntoTheBackupsNamespace(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	cluster := storagecluster.Start(t, storagecluster.Options{Nodes: 1})
	cluster.PoolClaim(t, &storagev1alpha1.StoragePoolClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "restores"},
		Spec: storagev1alpha1.StoragePoolClaimSpec{MinPools: 1, Capacity: resource.MustParse("256Mi"), Backend: storagev1alpha1.BackendFile,
			NodeSelector: map[string]string{simnode.Label: "true"}},
	})
	startRestoringSidecar(t, env, "restores", 10*time.Second)
	mine, theirs := env.Namespace(t), env.Namespace(t)
	// Registered last, so it runs first, while everything still runs: the claims and their
	// volumes go, and the next test of the package finds none.
	t.Cleanup(func() {
		ctx := context.Background()
		if err := env.Client.DeleteAllOf(ctx, &corev1.PersistentVolumeClaim{}, client.InNamespace(mine)); err != nil {
			t.Errorf("deleting the claims: %v", err)
		}
		testenv.Eventually(t, 60*time.Second, "the volumes gone", func(ctx context.Context) (bool, error) {
			var vols storagev1alpha1.CStorVolumeList
			if err := env.Client.List(ctx, &vols, client.InNamespace(install.SystemNamespace)); err != nil {
				return false, err
			}
			if len(vols.Items) != 0 {
				return false, fmt.Errorf("%d volumes left", len(vols.Items))
			}
			return true, nil
		})
	})

	// The store, holding a backup that namespace theirs made.
	srv := s3server.Start(t)
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: storagev1alpha1.BackupNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: storagev1alpha1.BackupNamespace, Name: "restores"},
		Data:       map[string][]byte{"accessKeyID": []byte(srv.AccessKey), "secretAccessKey": []byte(srv.SecretKey), "key": key},
	}
	if err := env.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), secret) })
	s3, err := backup.NewS3(ctx, backup.S3Options{Endpoint: srv.Endpoint, Bucket: "restores", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, Insecure: true, CreateBucket: true})
	if err != nil {
		t.Fatal(err)
	}
	repo, err := backup.Open(ctx, s3, key, backup.InitOptions{ChunkSize: storagev1alpha1.DefaultBackupChunkSize})
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 4<<20)
	_, _ = rand.Read(data)
	const id = "00000000-0000-0000-0000-00000000c0de"
	if _, err := repo.Backup(ctx, bytes.NewReader(data), int64(len(data)), backup.BackupOptions{ID: id, Volume: theirs + "/data",
		Labels: map[string]string{storeref.ManifestNamespace: theirs, storeref.ManifestName: "nightly"}}); err != nil {
		t.Fatal(err)
	}
	store := &storagev1alpha1.BackupStore{
		ObjectMeta: metav1.ObjectMeta{Name: "restores-" + mine},
		Spec: storagev1alpha1.BackupStoreSpec{
			Endpoint: "http://" + srv.Endpoint, Bucket: "restores",
			AccessKeyID:     storagev1alpha1.SecretKeyRef{Name: secret.Name, Key: "accessKeyID"},
			SecretAccessKey: storagev1alpha1.SecretKeyRef{Name: secret.Name, Key: "secretAccessKey"},
			EncryptionKey:   storagev1alpha1.SecretKeyRef{Name: secret.Name, Key: "key"},
		},
	}
	if err := env.Client.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), store) })

	// Namespace mine names it, and restores it.
	named := &storagev1alpha1.VolumeBackup{
		ObjectMeta: metav1.ObjectMeta{Namespace: mine, Name: "theirs", Annotations: map[string]string{storagev1alpha1.AnnotationBackupID: id}},
		Spec:       storagev1alpha1.VolumeBackupSpec{Store: store.Name},
	}
	if err := env.Client.Create(ctx, named); err != nil {
		t.Fatal(err)
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: mine, Name: "from-theirs"},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To("restores"),
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("8Mi")}},
			DataSourceRef:    &corev1.TypedObjectReference{APIGroup: ptr.To(storagev1alpha1.GroupVersion.Group), Kind: "VolumeBackup", Name: named.Name},
		},
	}
	if err := env.Client.Create(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	const why = "was made in another namespace: a backup is restored only in the namespace it was made in, unless its BackupStore's spec.allowedNamespaces names this one"
	testenv.Eventually(t, 60*time.Second, "claim "+pvc.Name+" waiting, saying why", func(ctx context.Context) (bool, error) {
		if n := countEvents(ctx, t, env.Client, pvc, why); n < 2 {
			return false, fmt.Errorf("%d such Events; all: %s", n, describeEvents(ctx, env.Client, pvc))
		}
		return true, nil
	})
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
		t.Fatal(err)
	}
	var vols storagev1alpha1.CStorVolumeList
	if err := env.Client.List(ctx, &vols, client.InNamespace(install.SystemNamespace)); err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimPending || pvc.Spec.VolumeName != "" || len(vols.Items) != 0 {
		t.Fatalf("a claim filled from another namespace's backup: phase %s, volume %q, %d CStorVolumes", pvc.Status.Phase, pvc.Spec.VolumeName, len(vols.Items))
	}

	// The store's owner lets namespace mine restore its backups.
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(store), store); err != nil {
		t.Fatal(err)
	}
	// A patch, not an update: the operator writes the store's status meanwhile.
	before := client.MergeFrom(store.DeepCopy())
	store.Spec.AllowedNamespaces = []string{mine}
	if err := env.Client.Patch(ctx, store, before); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 120*time.Second, "claim "+pvc.Name+" Bound once allowed", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
			return false, err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return false, fmt.Errorf("phase %q; events: %s", pvc.Status.Phase, describeEvents(ctx, env.Client, pvc))
		}
		return true, nil
	})
	vol := &storagev1alpha1.CStorVolume{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: pvc.Spec.VolumeName}, vol); err != nil {
		t.Fatal(err)
	}
	if src := vol.Spec.Source; src == nil || src.Backup == nil || src.Backup.Store != store.Name || src.Backup.ID != id {
		t.Errorf("the claim's volume has source %+v, want backup %s of store %s", src, id, store.Name)
	}
}

// The provisioner checks, on its own, whose backup a VolumeBackup is: one that an operator
// completed before it refused other namespaces' backups (a cluster upgraded with such objects
// in it) fills no claim until the operator has judged it again. Here no operator runs, and the
// VolumeBackups' status is what the older one left: Completed, with the ID of a backup made
// in another namespace, or with no namespace recorded at all.
func TestRestoreChecksWhoseBackupItIs(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	startRestoringSidecar(t, env, "old-restores", 5*time.Second)
	mine, theirs := env.Namespace(t), env.Namespace(t)
	store := &storagev1alpha1.BackupStore{
		ObjectMeta: metav1.ObjectMeta{Name: "old-" + mine},
		Spec: storagev1alpha1.BackupStoreSpec{
			Endpoint: "http://127.0.0.1:1", Bucket: "old",
			AccessKeyID:     storagev1alpha1.SecretKeyRef{Name: "none", Key: "a"},
			SecretAccessKey: storagev1alpha1.SecretKeyRef{Name: "none", Key: "s"},
			EncryptionKey:   storagev1alpha1.SecretKeyRef{Name: "none", Key: "k"},
		},
	}
	if err := env.Client.Create(ctx, store); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), store) })

	for _, tc := range []struct{ name, id, origin, why string }{
		{name: "of-theirs", id: "00000000-0000-0000-0000-0000000000d1", origin: theirs, why: "was made in another namespace"},
		{name: "of-nobody", id: "00000000-0000-0000-0000-0000000000d2", origin: "", why: "records no namespace it was made in"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &storagev1alpha1.VolumeBackup{
				ObjectMeta: metav1.ObjectMeta{Namespace: mine, Name: tc.name, Annotations: map[string]string{storagev1alpha1.AnnotationBackupID: tc.id}},
				Spec:       storagev1alpha1.VolumeBackupSpec{Store: store.Name},
			}
			if err := env.Client.Create(ctx, b); err != nil {
				t.Fatal(err)
			}
			b.Status = storagev1alpha1.VolumeBackupStatus{Phase: storagev1alpha1.BackupCompleted, BackupID: tc.id,
				OriginNamespace: tc.origin, Size: resource.NewQuantity(1<<20, resource.BinarySI)}
			if err := env.Client.Status().Update(ctx, b); err != nil {
				t.Fatal(err)
			}
			pvc := &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Namespace: mine, Name: tc.name},
				Spec: corev1.PersistentVolumeClaimSpec{
					StorageClassName: ptr.To("old-restores"),
					AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
					Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("8Mi")}},
					DataSourceRef:    &corev1.TypedObjectReference{APIGroup: ptr.To(storagev1alpha1.GroupVersion.Group), Kind: "VolumeBackup", Name: b.Name},
				},
			}
			if err := env.Client.Create(ctx, pvc); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(context.Background(), pvc) })
			want := fmt.Sprintf("VolumeBackup %s/%s names backup %s of store %s, which %s", mine, b.Name, b.Status.BackupID, store.Name, tc.why)
			testenv.Eventually(t, 30*time.Second, "claim "+pvc.Name+" waiting, saying why", func(ctx context.Context) (bool, error) {
				if n := countEvents(ctx, t, env.Client, pvc, want); n < 2 {
					return false, fmt.Errorf("%d such Events; all: %s", n, describeEvents(ctx, env.Client, pvc))
				}
				return true, nil
			})
			err := env.Client.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: "pvc-" + string(pvc.UID)}, &storagev1alpha1.CStorVolume{})
			if !apierrors.IsNotFound(err) {
				t.Errorf("a volume was made for a claim filled from another namespace's backup: %v", err)
			}
		})
	}
}

// startRestoringSidecar runs the driver and the sidecar, and makes StorageClass class (one
// replica, reclaim Delete), removed after the test.
func startRestoringSidecar(t *testing.T, env *testenv.Env, class string, callTimeout time.Duration) {
	t.Helper()
	socket := serveDriver(t, env, driver.Options{})
	sm := testenv.NewManager(t, env.AsServiceAccount(t, "csi-sidecar"))
	if err := sidecar.Add(sm, sidecar.Options{DriverEndpoint: socket, DriverName: driver.Name, CallTimeout: callTimeout,
		BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second, Resync: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "sidecar", sm.Start)
	sc := &storagev1.StorageClass{
		ObjectMeta:    metav1.ObjectMeta{Name: class},
		Provisioner:   driver.Name,
		Parameters:    map[string]string{driver.ParamReplicaCount: "1"},
		ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete),
	}
	if err := env.Client.Create(context.Background(), sc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sc) })
}
