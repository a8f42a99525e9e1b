package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/storage/backup"
	"github.com/crdipc/crdipc/internal/storage/replica"
	"github.com/crdipc/crdipc/internal/storage/storeref"
)

// The agent uploads the VolumeBackups the operator gave its node (LabelBackupNode): it reads
// the snapshot copy beside its replica's data and writes their progress into their status.
// It reads the stores and, in the backup namespace only, their Secrets.
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=volumebackups,verbs=get;list;watch
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=volumebackups/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=storage.crdipc.io,resources=backupstores,verbs=get
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get,namespace=crdipc-backup

// progressEvery is how often a running upload writes its progress into the status.
const progressEvery = time.Second

// backupMetrics count what the node agents upload, by store. Agents of several nodes share a
// process in up: one set, registered once.
var backupMetrics = sync.OnceValue(func() *backupCounters {
	m := &backupCounters{
		read: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "crdipc_backup_read_bytes_total",
			Help: "Bytes of volume snapshots read by backups, by store.",
		}, []string{"store"}),
		uploaded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "crdipc_backup_uploaded_bytes_total",
			Help: "Bytes (compressed and encrypted) that backups wrote to their store, by store.",
		}, []string{"store"}),
		done: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "crdipc_backups_total",
			Help: "Backup uploads that ended, by store and result (completed, failed).",
		}, []string{"store", "result"}),
	}
	metrics.Registry.MustRegister(m.read, m.uploaded, m.done)
	return m
})

type backupCounters struct {
	read, uploaded, done *prometheus.CounterVec
}

// backupUploader uploads the node's VolumeBackups.
type backupUploader struct {
	node string
	c    client.Client // cached: the node's replicas and backups
	live client.Reader // the API server: snapshots, stores, Secrets
	log  logr.Logger
}

func (u *backupUploader) setup(mgr manager.Manager, concurrency int) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&storagev1alpha1.VolumeBackup{}).
		Named("volumebackup-agent").
		WithOptions(controller.Options{MaxConcurrentReconciles: concurrency}).
		Complete(u)
}

// Reconcile uploads one backup, or goes on with one an earlier process left: the store's
// backup of an ID resumes where it stopped, and one that is complete is returned as it is.
func (u *backupUploader) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var b storagev1alpha1.VolumeBackup
	if err := u.c.Get(ctx, req.NamespacedName, &b); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	st := b.Status
	if !b.DeletionTimestamp.IsZero() || st.CompletionTime != nil || st.Node != u.node || st.Snapshot == "" || st.BackupID == "" || st.Phase != storagev1alpha1.BackupUploading {
		return reconcile.Result{}, nil
	}
	err := u.upload(ctx, &b)
	if errors.Is(err, errBackupDeleted) {
		u.log.Info("backup deleted while it uploaded: stopped, no manifest written", "backup", req.NamespacedName)
		return reconcile.Result{}, nil
	}
	if err != nil {
		backupMetrics().done.WithLabelValues(b.Spec.Store, "failed").Inc()
		u.log.Error(err, "backup upload failed; retrying", "backup", req.NamespacedName)
		if perr := u.patch(ctx, &b, func(s *storagev1alpha1.VolumeBackupStatus) { s.UploadError = err.Error() }); perr != nil {
			return reconcile.Result{}, errors.Join(err, perr)
		}
	}
	return reconcile.Result{}, err
}

func (u *backupUploader) upload(ctx context.Context, b *storagev1alpha1.VolumeBackup) error {
	var snap storagev1alpha1.CStorVolumeSnapshot
	if err := u.live.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: b.Status.Snapshot}, &snap); err != nil {
		return fmt.Errorf("reading snapshot %s: %w", b.Status.Snapshot, err)
	}
	var data string
	for _, c := range snap.Status.Copies {
		if c.Node != u.node {
			continue
		}
		var r storagev1alpha1.CStorVolumeReplica
		if err := u.c.Get(ctx, client.ObjectKey{Namespace: snap.Namespace, Name: c.Replica}, &r); err != nil {
			return fmt.Errorf("replica %s holding the snapshot's copy: %w", c.Replica, err)
		}
		if r.Status.Location == "" {
			return fmt.Errorf("replica %s holding the snapshot's copy has no data file yet", c.Replica)
		}
		data, _ = replica.SnapshotFiles(r.Status.Location, string(snap.UID))
	}
	if data == "" {
		return fmt.Errorf("node %s holds no copy of snapshot %s", u.node, snap.Name)
	}
	if snap.Status.Size == nil {
		return fmt.Errorf("snapshot %s has no size yet", snap.Name)
	}
	size := snap.Status.Size.Value()
	f, err := os.Open(data)
	if err != nil {
		return fmt.Errorf("opening the snapshot's copy: %w", err)
	}
	defer f.Close()

	var store storagev1alpha1.BackupStore
	if err := u.live.Get(ctx, client.ObjectKey{Name: b.Spec.Store}, &store); err != nil {
		return fmt.Errorf("backup store %s: %w", b.Spec.Store, err)
	}
	repo, err := storeref.Open(ctx, u.live, &store, false)
	if err != nil {
		return fmt.Errorf("backup store %s: %w", store.Name, err)
	}
	start := metav1.Now()
	if b.Status.StartTime != nil {
		start = *b.Status.StartTime
	}
	if err := u.patch(ctx, b, func(s *storagev1alpha1.VolumeBackupStatus) { s.StartTime = &start }); err != nil {
		return err
	}

	// What earlier attempts (a killed agent's, a failed one) uploaded, as they last wrote it.
	before := struct{ bytes, objects int64 }{b.Status.BytesUploaded, b.Status.ObjectsUploaded}
	attempt := time.Now()
	// Progress is written from here, at most once a second, so the upload never waits for
	// the API server.
	var (
		mu     sync.Mutex
		latest backup.Progress
		last   backup.Progress
	)
	report := func() {
		mu.Lock()
		p := latest
		mu.Unlock()
		if p == last {
			return
		}
		m := backupMetrics()
		m.read.WithLabelValues(store.Name).Add(float64(p.Done - last.Done))
		m.uploaded.WithLabelValues(store.Name).Add(float64(p.UploadedBytes - last.UploadedBytes))
		last = p
		if err := u.patch(ctx, b, func(s *storagev1alpha1.VolumeBackupStatus) {
			s.BytesDone, s.BytesUploaded, s.ObjectsUploaded = p.Done, before.bytes+p.UploadedBytes, before.objects+p.Uploaded
			s.Throughput = throughput(p.Done, time.Since(start.Time))
		}); err != nil && ctx.Err() == nil {
			u.log.Info("writing backup progress", "backup", b.Name, "error", err.Error())
		}
	}
	// A backup deleted meanwhile stops at the next tick: the operator's finalizer waits for
	// that (the store's marker) before it deletes what the backup left.
	uctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The goroutine below patches b (the API server's answer is decoded into it) while the
	// upload runs, Commit included: both ask after the backup by what does not change.
	key, uid := client.ObjectKeyFromObject(b), b.UID
	stop := make(chan struct{})
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				report()
				if u.deleted(ctx, u.c, key, uid) {
					cancel(errBackupDeleted)
				}
			}
		}
	}()
	m, err := repo.Backup(uctx, f, size, backup.BackupOptions{
		ID:     b.Status.BackupID,
		Volume: b.Status.Volume,
		Source: b.Status.VolumeSnapshot,
		Labels: map[string]string{
			storeref.ManifestNamespace: b.Namespace,
			storeref.ManifestName:      b.Name,
		},
		Progress: func(p backup.Progress) {
			mu.Lock()
			latest = p
			mu.Unlock()
		},
		// Read from the API server, not the cache: a deletion the cache has not seen yet
		// would leave a manifest no VolumeBackup stands for, which the store's next sync
		// would bring back.
		Commit: func(ctx context.Context) error {
			if u.deleted(ctx, u.live, key, uid) {
				return errBackupDeleted
			}
			return nil
		},
	})
	close(stop)
	<-reported
	if errors.Is(context.Cause(uctx), errBackupDeleted) {
		return errBackupDeleted
	}
	if err != nil {
		return err
	}
	report()
	if m.Created.Before(attempt) {
		// Written by an earlier attempt, whose own counts the manifest holds.
		before.bytes, before.objects = 0, 0
	}
	done := metav1.Now()
	backupMetrics().done.WithLabelValues(store.Name, "completed").Inc()
	u.log.Info("backup uploaded", "backup", b.Name, "namespace", b.Namespace, "bytes", size, "uploadedBytes", m.Stats.UploadedBytes, "uploadedObjects", m.Stats.Uploaded)
	return u.patch(ctx, b, func(s *storagev1alpha1.VolumeBackupStatus) {
		s.BytesDone = size
		// What this backup added to the store, over every attempt: an attempt finds what the
		// earlier ones stored and does not count it, so their last progress is added.
		s.BytesUploaded, s.ObjectsUploaded = before.bytes+m.Stats.UploadedBytes, before.objects+m.Stats.Uploaded
		s.Throughput = throughput(size, done.Sub(start.Time))
		s.CompletionTime, s.UploadError = &done, ""
	})
}

// errBackupDeleted stops an upload whose VolumeBackup is being deleted.
var errBackupDeleted = errors.New("the VolumeBackup is being deleted")

// deleted tells whether the backup key with uid, as r has it, is gone or being deleted
// (another object of its name counts as gone). An error reading it is not taken for a
// deletion.
func (u *backupUploader) deleted(ctx context.Context, r client.Reader, key client.ObjectKey, uid types.UID) bool {
	var now storagev1alpha1.VolumeBackup
	err := r.Get(ctx, key, &now)
	if apierrors.IsNotFound(err) {
		return true
	}
	return err == nil && (now.UID != uid || !now.DeletionTimestamp.IsZero())
}

// patch writes the status fields the agent owns with a merge patch of what change makes:
// the operator's fields, and its conditions, are left as they are.
func (u *backupUploader) patch(ctx context.Context, b *storagev1alpha1.VolumeBackup, change func(*storagev1alpha1.VolumeBackupStatus)) error {
	before := b.DeepCopy()
	change(&b.Status)
	if err := u.c.Status().Patch(ctx, b, client.MergeFrom(before)); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("writing the status of backup %s: %w", b.Name, err)
	}
	return nil
}

// throughput is n bytes in d, per second, in binary units: "212.4MiB/s".
func throughput(n int64, d time.Duration) string {
	if d <= 0 {
		return ""
	}
	v := float64(n) / d.Seconds()
	unit := "B"
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if v < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	return fmt.Sprintf("%.1f%s/s", v, unit)
}
