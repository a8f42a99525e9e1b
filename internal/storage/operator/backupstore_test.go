package operator_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/backup"
	"github.com/crdipc/crdipc/internal/storage/backup/s3local"
	"github.com/crdipc/crdipc/internal/storage/operator"
	"github.com/crdipc/crdipc/internal/storage/storeref"
	"github.com/crdipc/crdipc/internal/testenv/s3server"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// storeFixture is a bucket on a real S3 server and the Secret a BackupStore of it names.
type storeFixture struct {
	srv    *s3local.Server
	bucket string
	secret string
	key    []byte
}

func newStoreFixture(t *testing.T, c *cluster) *storeFixture {
	t.Helper()
	f := &storeFixture{srv: s3server.Start(t), bucket: "bucket-" + c.id, secret: "s3-" + c.id, key: make([]byte, 32)}
	_, _ = rand.Read(f.key)
	if _, err := backup.NewS3(t.Context(), f.s3Options()); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: storagev1alpha1.BackupNamespace}}
	if err := c.c.Create(t.Context(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return f
}

func (f *storeFixture) s3Options() backup.S3Options {
	return backup.S3Options{Endpoint: f.srv.Endpoint, Bucket: f.bucket, AccessKey: f.srv.AccessKey, SecretKey: f.srv.SecretKey, Insecure: true, CreateBucket: true}
}

// createSecret stores the S3 credentials and the key under keys accessKeyID,
// secretAccessKey and key.
func (f *storeFixture) createSecret(t *testing.T, c *cluster) {
	t.Helper()
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: storagev1alpha1.BackupNamespace, Name: f.secret},
		Data:       map[string][]byte{"accessKeyID": []byte(f.srv.AccessKey), "secretAccessKey": []byte(f.srv.SecretKey), "key": f.key},
	}
	if err := c.c.Create(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.c.Delete(context.Background(), s) })
}

func (f *storeFixture) store(name, endpoint string) *storagev1alpha1.BackupStore {
	return &storagev1alpha1.BackupStore{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: storagev1alpha1.BackupStoreSpec{
			Endpoint:        endpoint,
			Bucket:          f.bucket,
			AccessKeyID:     storagev1alpha1.SecretKeyRef{Name: f.secret, Key: "accessKeyID"},
			SecretAccessKey: storagev1alpha1.SecretKeyRef{Name: f.secret, Key: "secretAccessKey"},
			EncryptionKey:   storagev1alpha1.SecretKeyRef{Name: f.secret, Key: "key"},
		},
	}
}

// repository opens the fixture's store from outside the cluster, as a user with the bucket
// and the key would.
func (f *storeFixture) repository(t *testing.T) *backup.Repository {
	t.Helper()
	s, err := backup.NewS3(t.Context(), f.s3Options())
	if err != nil {
		t.Fatal(err)
	}
	r, err := backup.OpenExisting(t.Context(), s, f.key)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// waitReady waits for obj's Ready condition to have status and reason, and returns it.
func waitReady(t *testing.T, c *cluster, obj client.Object, status metav1.ConditionStatus, reason string) metav1.Condition {
	t.Helper()
	var got metav1.Condition
	wait.Eventually(t, 60*time.Second, obj.GetName()+" Ready="+string(status)+" "+reason, func(ctx context.Context) (bool, error) {
		if err := c.c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return false, err
		}
		cond := meta.FindStatusCondition(obj.(conditions.Object).GetConditions(), conditions.TypeReady)
		if cond == nil {
			return false, nil
		}
		got = *cond
		return cond.Status == status && cond.Reason == reason, nil
	})
	return got
}

// A store opens once its Secret exists, and every backup in its bucket that a VolumeBackup
// made becomes one again in the cluster: a new cluster given the bucket and the key finds
// them all. Its retention policy deletes the older backups of a volume, from the bucket and
// the cluster.
func TestBackupStoreFindsTheBackupsInItsBucket(t *testing.T) {
	c := newCluster(t)
	f := newStoreFixture(t, c)
	c.startOperator(func(o *operator.Options) { o.StoreSync = 500 * time.Millisecond })
	store := f.store("store-"+c.id, "http://"+f.srv.Endpoint)
	if err := c.c.Create(t.Context(), store); err != nil {
		t.Fatal(err)
	}
	cond := waitReady(t, c, store, metav1.ConditionFalse, "SecretMissing")
	if !strings.Contains(cond.Message, f.secret) {
		t.Errorf("a store whose Secret is missing says %q, not naming the Secret %s", cond.Message, f.secret)
	}
	f.createSecret(t, c)
	cond = waitReady(t, c, store, metav1.ConditionTrue, conditions.ReasonSucceeded)
	if store.Status.ChunkSize <= 0 || !strings.Contains(cond.Message, "0 backups in s3://") {
		t.Errorf("an empty store opened: chunk size %d, message %q", store.Status.ChunkSize, cond.Message)
	}
	for _, s := range []string{f.srv.SecretKey, string(f.key)} {
		if strings.Contains(cond.Message, s) {
			t.Errorf("the store's status holds a secret: %q", cond.Message)
		}
	}

	// Backups made elsewhere (another cluster) into the same bucket.
	repo := f.repository(t)
	data := make([]byte, 3<<20)
	_, _ = rand.Read(data)
	put := func(id, name string) *backup.Manifest {
		m, err := repo.Backup(t.Context(), bytes.NewReader(data), int64(len(data)), backup.BackupOptions{
			ID: id, Volume: c.ns + "/data",
			Labels: map[string]string{storeref.ManifestNamespace: c.ns, storeref.ManifestName: name},
		})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	put("00000000-0000-0000-0000-000000000001", "nightly-1")
	found := &storagev1alpha1.VolumeBackup{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "nightly-1"}}
	wait.Eventually(t, 30*time.Second, "the backup found in the bucket becomes a VolumeBackup", func(ctx context.Context) (bool, error) {
		return client.IgnoreNotFound(c.c.Get(ctx, client.ObjectKeyFromObject(found), found)) == nil && found.UID != "", nil
	})
	waitReady(t, c, found, metav1.ConditionTrue, conditions.ReasonSucceeded)
	if st := found.Status; st.Phase != storagev1alpha1.BackupCompleted || st.Volume != c.ns+"/data" || st.Size.Value() != int64(len(data)) || st.BackupID != "00000000-0000-0000-0000-000000000001" {
		t.Errorf("found backup's status: %+v", st)
	}
	if found.Spec.Source != nil || found.Spec.Store != store.Name {
		t.Errorf("found backup's spec: %+v", found.Spec)
	}

	// Two more, then keep the newest only.
	put("00000000-0000-0000-0000-000000000002", "nightly-2")
	second := &storagev1alpha1.VolumeBackup{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "nightly-2"}}
	waitReady(t, c, second, metav1.ConditionTrue, conditions.ReasonSucceeded)
	if err := c.c.Get(t.Context(), client.ObjectKeyFromObject(store), store); err != nil {
		t.Fatal(err)
	}
	// A patch, not an update: the operator writes the store's status meanwhile.
	before := client.MergeFrom(store.DeepCopy())
	store.Spec.Retention = &storagev1alpha1.BackupRetention{KeepLast: ptr.To[int32](1)}
	if err := c.c.Patch(t.Context(), store, before); err != nil {
		t.Fatal(err)
	}
	wait.Eventually(t, 30*time.Second, "the older backup deleted by the retention policy, from the bucket and the cluster", func(ctx context.Context) (bool, error) {
		if _, err := repo.Manifest(ctx, "00000000-0000-0000-0000-000000000001"); err == nil {
			return false, nil
		}
		err := c.c.Get(ctx, client.ObjectKeyFromObject(found), &storagev1alpha1.VolumeBackup{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if _, err := repo.Manifest(t.Context(), "00000000-0000-0000-0000-000000000002"); err != nil {
		t.Errorf("the newest backup went too: %v", err)
	}
	if _, err := repo.Restore(t.Context(), "00000000-0000-0000-0000-000000000002", &discard{}, backup.RestoreOptions{}); err != nil {
		t.Errorf("the newest backup does not restore after the retention policy ran: %v", err)
	}
}

// A store that cannot be opened says why, in a reason a user can act on, and the backups into
// it wait: a wrong key, a server that does not answer, a store that does not exist.
func TestBackupStoreFailures(t *testing.T) {
	c := newCluster(t)
	f := newStoreFixture(t, c)
	f.createSecret(t, c)
	// The bucket holds a store made with another key.
	other := make([]byte, 32)
	_, _ = rand.Read(other)
	s, err := backup.NewS3(t.Context(), f.s3Options())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := backup.Open(t.Context(), s, other, backup.InitOptions{}); err != nil {
		t.Fatal(err)
	}
	c.startOperator()

	wrong := f.store("wrong-key-"+c.id, "http://"+f.srv.Endpoint)
	if err := c.c.Create(t.Context(), wrong); err != nil {
		t.Fatal(err)
	}
	cond := waitReady(t, c, wrong, metav1.ConditionFalse, "WrongKey")
	if !strings.Contains(cond.Message, f.bucket) {
		t.Errorf("a wrong key is reported as %q, not naming the store's bucket %s", cond.Message, f.bucket)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	away := f.store("unreachable-"+c.id, "http://"+closed)
	if err := c.c.Create(t.Context(), away); err != nil {
		t.Fatal(err)
	}
	cond = waitReady(t, c, away, metav1.ConditionFalse, "Unreachable")
	if !strings.Contains(cond.Message, closed) {
		t.Errorf("an unreachable store is reported as %q, not naming %s", cond.Message, closed)
	}

	pending := &storagev1alpha1.VolumeBackup{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "into-unreachable"},
		Spec:       storagev1alpha1.VolumeBackupSpec{Store: away.Name, Source: &storagev1alpha1.BackupSource{PersistentVolumeClaimName: "data"}},
	}
	nowhere := &storagev1alpha1.VolumeBackup{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "into-nothing"},
		Spec:       storagev1alpha1.VolumeBackupSpec{Store: "no-such-store", Source: &storagev1alpha1.BackupSource{PersistentVolumeClaimName: "data"}},
	}
	for _, b := range []*storagev1alpha1.VolumeBackup{pending, nowhere} {
		if err := c.c.Create(t.Context(), b); err != nil {
			t.Fatal(err)
		}
	}
	cond = waitReady(t, c, pending, metav1.ConditionFalse, "StoreNotReady")
	if !strings.Contains(cond.Message, closed) || pending.Status.Phase != storagev1alpha1.BackupPending {
		t.Errorf("a backup into an unreachable store: phase %s, %q", pending.Status.Phase, cond.Message)
	}
	waitReady(t, c, nowhere, metav1.ConditionFalse, "StoreNotFound")

	// Exactly one source.
	both := &storagev1alpha1.VolumeBackup{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "both"},
		Spec:       storagev1alpha1.VolumeBackupSpec{Store: away.Name, Source: &storagev1alpha1.BackupSource{PersistentVolumeClaimName: "data", VolumeSnapshotName: "snap"}},
	}
	if err := c.c.Create(t.Context(), both); err == nil || !strings.Contains(err.Error(), "exactly one of") {
		t.Errorf("a backup with two sources: %v", err)
	}
}

// discard is an io.WriterAt that keeps nothing.
type discard struct{}

func (discard) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }

// A backup deleted (deletionPolicy Delete) while its upload runs is deleted from the store
// only once that upload has stopped: the manifest an upload writes after the delete would
// otherwise stay in the bucket, and the store's next sync would make the backup again.
func TestDeletedBackupWaitsForItsUpload(t *testing.T) {
	c := newCluster(t)
	f := newStoreFixture(t, c)
	f.createSecret(t, c)
	c.startOperator(func(o *operator.Options) { o.StoreSync = 500 * time.Millisecond })
	store := f.store("store-"+c.id, "http://"+f.srv.Endpoint)
	if err := c.c.Create(t.Context(), store); err != nil {
		t.Fatal(err)
	}
	waitReady(t, c, store, metav1.ConditionTrue, conditions.ReasonSucceeded)
	b := &storagev1alpha1.VolumeBackup{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "deleted-mid-upload"},
		Spec: storagev1alpha1.VolumeBackupSpec{Store: store.Name, DeletionPolicy: storagev1alpha1.BackupDelete,
			Source: &storagev1alpha1.BackupSource{PersistentVolumeClaimName: "data"}},
	}
	if err := c.c.Create(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	waitReady(t, c, b, metav1.ConditionFalse, "SourceNotFound")
	id := b.Status.BackupID
	if id != string(b.UID) {
		t.Fatalf("backup ID %q, want the UID %s", id, b.UID)
	}

	// An upload of it, as a node's agent runs one, held in the middle of reading.
	repo := f.repository(t)
	data := make([]byte, 2<<20)
	_, _ = rand.Read(data)
	src := &heldReader{r: bytes.NewReader(data), reached: make(chan struct{}), release: make(chan struct{})}
	uploaded := make(chan error, 1)
	go func() {
		_, err := repo.Backup(t.Context(), src, int64(len(data)), backup.BackupOptions{ID: id, Volume: c.ns + "/data",
			Labels: map[string]string{storeref.ManifestNamespace: c.ns, storeref.ManifestName: b.Name}})
		uploaded <- err
	}()
	<-src.reached
	if err := c.c.Delete(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	cond := waitReady(t, c, b, metav1.ConditionFalse, "Deleting")
	if !strings.Contains(cond.Message, "waiting for the upload") {
		t.Errorf("a backup deleted while it uploads: %q", cond.Message)
	}
	close(src.release)
	if err := <-uploaded; err != nil {
		t.Fatal(err)
	}
	wait.Eventually(t, 60*time.Second, "the backup deleted from the cluster and the store once its upload wrote its manifest", func(ctx context.Context) (bool, error) {
		err := c.c.Get(ctx, client.ObjectKeyFromObject(b), &storagev1alpha1.VolumeBackup{})
		if !apierrors.IsNotFound(err) {
			return false, client.IgnoreNotFound(err)
		}
		_, err = repo.Manifest(ctx, id)
		return errors.Is(err, backup.ErrNotFound), nil
	})
}

// heldReader's reads wait until release, after saying so once.
type heldReader struct {
	r       io.ReaderAt
	once    sync.Once
	reached chan struct{}
	release chan struct{}
}

func (h *heldReader) ReadAt(p []byte, off int64) (int, error) {
	h.once.Do(func() { close(h.reached) })
	<-h.release
	return h.r.ReadAt(p, off)
}

// A backup is restored only in the namespace it was made in. Its ID is no secret (the UID of
// the VolumeBackup that made it), so a VolumeBackup of another namespace that names it by
// annotation is refused, saying why: it is never Completed (no claim is filled from it), and
// deleting it with deletionPolicy Delete leaves the backup in the bucket. It does not keep
// the backup from being found in its own namespace either. The store's owner lets another
// namespace restore it (spec.allowedNamespaces), never delete it, and can take that back; a
// backup that records no namespace is restored only where the store allows.
func TestBackupOfAnotherNamespaceIsRefused(t *testing.T) {
	c := newCluster(t)
	f := newStoreFixture(t, c)
	f.createSecret(t, c)
	theirs := c.env.Namespace(t)

	// The bucket holds a backup made in namespace theirs, and one made by no VolumeBackup.
	s, err := backup.NewS3(t.Context(), f.s3Options())
	if err != nil {
		t.Fatal(err)
	}
	repo, err := backup.Open(t.Context(), s, f.key, backup.InitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 1<<20)
	_, _ = rand.Read(data)
	const id, loose = "00000000-0000-0000-0000-0000000000b1", "00000000-0000-0000-0000-0000000000b2"
	for _, o := range []backup.BackupOptions{
		{ID: id, Volume: theirs + "/data", Labels: map[string]string{storeref.ManifestNamespace: theirs, storeref.ManifestName: "nightly"}},
		{ID: loose, Volume: "data"},
	} {
		if _, err := repo.Backup(t.Context(), bytes.NewReader(data), int64(len(data)), o); err != nil {
			t.Fatal(err)
		}
	}
	named := func(name, id string) *storagev1alpha1.VolumeBackup {
		b := &storagev1alpha1.VolumeBackup{
			ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: name, Annotations: map[string]string{storagev1alpha1.AnnotationBackupID: id}},
			Spec:       storagev1alpha1.VolumeBackupSpec{Store: "store-" + c.id, DeletionPolicy: storagev1alpha1.BackupDelete},
		}
		if err := c.c.Create(t.Context(), b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	refused := func(b *storagev1alpha1.VolumeBackup, why string) {
		t.Helper()
		cond := waitReady(t, c, b, metav1.ConditionFalse, conditions.ReasonFailed)
		if !strings.Contains(cond.Message, why) || !strings.Contains(cond.Message, "allowedNamespaces") || strings.Contains(cond.Message, theirs) {
			t.Errorf("VolumeBackup %s naming another namespace's backup says %q: want why (%s), how to allow it, and not whose it is", b.Name, cond.Message, why)
		}
		if st := b.Status; st.Phase != storagev1alpha1.BackupFailed || st.BackupID != "" || st.Volume != "" || st.Size != nil || st.OriginNamespace != "" {
			t.Errorf("VolumeBackup %s naming another namespace's backup: status %+v, want Failed and nothing of the backup", b.Name, st)
		}
	}
	// Named from namespace c.ns before the store is even made: it must not keep the backup
	// from being found in its own namespace.
	steal := named("steal", id)
	c.startOperator(func(o *operator.Options) { o.StoreSync = 500 * time.Millisecond })
	store := f.store("store-"+c.id, "http://"+f.srv.Endpoint)
	if err := c.c.Create(t.Context(), store); err != nil {
		t.Fatal(err)
	}
	own := &storagev1alpha1.VolumeBackup{ObjectMeta: metav1.ObjectMeta{Namespace: theirs, Name: "nightly"}}
	waitReady(t, c, own, metav1.ConditionTrue, conditions.ReasonSucceeded)
	if own.Status.OriginNamespace != theirs || own.Status.BackupID != id {
		t.Errorf("the backup found in its own namespace: status %+v", own.Status)
	}
	refused(steal, "was made in another namespace")
	looseRefused := named("loose", loose)
	refused(looseRefused, "records no namespace")

	// Deleting the refused one (policy Delete) leaves the backup in the bucket.
	for _, b := range []*storagev1alpha1.VolumeBackup{steal, looseRefused} {
		if err := c.c.Delete(t.Context(), b); err != nil {
			t.Fatal(err)
		}
		waitGone(t, c, b)
	}
	for _, id := range []string{id, loose} {
		if _, err := repo.Manifest(t.Context(), id); err != nil {
			t.Fatalf("backup %s went from the bucket with a VolumeBackup of another namespace: %v", id, err)
		}
	}

	// The store's owner lets namespace c.ns restore its backups: it may, but still not
	// delete them.
	allow := func(namespaces ...string) {
		t.Helper()
		if err := c.c.Get(t.Context(), client.ObjectKeyFromObject(store), store); err != nil {
			t.Fatal(err)
		}
		// A patch, not an update: the operator writes the store's status meanwhile.
		before := client.MergeFrom(store.DeepCopy())
		store.Spec.AllowedNamespaces = namespaces
		if err := c.c.Patch(t.Context(), store, before); err != nil {
			t.Fatal(err)
		}
	}
	allow(c.ns)
	borrowed := named("borrowed", id)
	waitReady(t, c, borrowed, metav1.ConditionTrue, conditions.ReasonSucceeded)
	if st := borrowed.Status; st.Phase != storagev1alpha1.BackupCompleted || st.BackupID != id || st.OriginNamespace != theirs {
		t.Errorf("a backup the store lets namespace %s restore: status %+v", c.ns, st)
	}
	borrowedLoose := named("borrowed-loose", loose)
	waitReady(t, c, borrowedLoose, metav1.ConditionTrue, conditions.ReasonSucceeded)
	if err := c.c.Delete(t.Context(), borrowedLoose); err != nil {
		t.Fatal(err)
	}
	waitGone(t, c, borrowedLoose)
	for _, id := range []string{id, loose} {
		if _, err := repo.Manifest(t.Context(), id); err != nil {
			t.Fatalf("backup %s went from the bucket with a VolumeBackup of a namespace allowed to restore it: %v", id, err)
		}
	}

	// Taken back: the completed one is refused again.
	allow()
	refused(borrowed, "was made in another namespace")
}

// waitGone waits for obj to be deleted.
func waitGone(t *testing.T, c *cluster, obj client.Object) {
	t.Helper()
	wait.Eventually(t, 60*time.Second, obj.GetName()+" deleted", func(ctx context.Context) (bool, error) {
		err := c.c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

// A backup's finalizer, which looks at its store every 2 s while an upload stops, uses the
// store as the store's sync opened it: it does not open it again (read its Secrets, GET its
// configuration) on every look. The store is reached through a proxy that counts requests.
func TestFinalizerReusesTheOpenedStore(t *testing.T) {
	c := newCluster(t)
	f := newStoreFixture(t, c)
	f.createSecret(t, c)
	var mu sync.Mutex
	opens, looks := 0, 0
	target, err := url.Parse("http://" + f.srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	backend := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		switch {
		case r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/crdipc-backup.json"):
			opens++
		case strings.Contains(r.URL.RawQuery, "prefix=pending"):
			looks++
		}
		mu.Unlock()
		backend.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	counts := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return opens, looks
	}
	// Synced once, at the start: the finalizer's looks come in the sync's interval.
	c.startOperator(func(o *operator.Options) { o.StoreSync = time.Hour })
	store := f.store("store-"+c.id, proxy.URL)
	if err := c.c.Create(t.Context(), store); err != nil {
		t.Fatal(err)
	}
	waitReady(t, c, store, metav1.ConditionTrue, conditions.ReasonSucceeded)
	b := &storagev1alpha1.VolumeBackup{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "deleted-mid-upload"},
		Spec: storagev1alpha1.VolumeBackupSpec{Store: store.Name, DeletionPolicy: storagev1alpha1.BackupDelete,
			Source: &storagev1alpha1.BackupSource{PersistentVolumeClaimName: "data"}},
	}
	if err := c.c.Create(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	waitReady(t, c, b, metav1.ConditionFalse, "SourceNotFound")
	repo := f.repository(t)
	data := make([]byte, 2<<20)
	_, _ = rand.Read(data)
	src := &heldReader{r: bytes.NewReader(data), reached: make(chan struct{}), release: make(chan struct{})}
	uploaded := make(chan error, 1)
	go func() {
		_, err := repo.Backup(t.Context(), src, int64(len(data)), backup.BackupOptions{ID: b.Status.BackupID, Volume: c.ns + "/data",
			Labels: map[string]string{storeref.ManifestNamespace: c.ns, storeref.ManifestName: b.Name}})
		uploaded <- err
	}()
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(src.release) }) })
	<-src.reached
	opened, looked := counts()
	if err := c.c.Delete(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	wait.Eventually(t, 30*time.Second, "the finalizer looking at the store 3 times while the upload runs", func(context.Context) (bool, error) {
		if _, n := counts(); n-looked < 3 {
			return false, fmt.Errorf("%d looks", n-looked)
		}
		return true, nil
	})
	if now, n := counts(); now-opened > 1 {
		t.Errorf("the store was opened %d times again for %d looks of the finalizer", now-opened, n-looked)
	}
	release.Do(func() { close(src.release) })
	if err := <-uploaded; err != nil {
		t.Fatal(err)
	}
	waitGone(t, c, b)
}
