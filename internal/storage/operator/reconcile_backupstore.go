package operator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/backup"
	"github.com/crdipc/crdipc/internal/storage/storeref"
	"github.com/crdipc/crdipc/ipc"
)

// DefaultStoreSync is how often a store is opened again: its backups are listed (those found
// in it become VolumeBackups), and its retention is applied.
const DefaultStoreSync = time.Minute

// DefaultPruneInterval is how often a store's unreferenced chunks are pruned.
const DefaultPruneInterval = time.Hour

// repos keeps the repository each store was last opened as, by the store's sync or by a
// backup: a backup's finalizer, which looks at its store every backupPoll while an upload
// stops, and the backups found in a store, use it instead of reading the store's three
// Secrets and its key check again each time. An entry serves the store's generation it was
// opened for, for maxAge: the store's sync opens it again (Secrets rotated, key changed) as
// often, and a sync that fails to open it drops it.
type repos struct {
	maxAge time.Duration

	mu     sync.Mutex
	opened map[types.UID]openedRepo
}

type openedRepo struct {
	generation int64
	at         time.Time
	repo       *backup.Repository
}

// get returns store's repository, opened again unless a fresh one is kept.
func (r *repos) get(ctx context.Context, live client.Reader, store *storagev1alpha1.BackupStore) (*backup.Repository, error) {
	r.mu.Lock()
	o, ok := r.opened[store.UID]
	r.mu.Unlock()
	if ok && o.generation == store.Generation && time.Since(o.at) < r.maxAge {
		return o.repo, nil
	}
	repo, err := storeref.Open(ctx, live, store, false)
	if err != nil {
		r.drop(store.UID)
		return nil, err
	}
	r.put(store, repo)
	return repo, nil
}

func (r *repos) put(store *storagev1alpha1.BackupStore, repo *backup.Repository) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.opened == nil {
		r.opened = map[types.UID]openedRepo{}
	}
	r.opened[store.UID] = openedRepo{generation: store.Generation, at: time.Now(), repo: repo}
}

func (r *repos) drop(uid types.UID) {
	r.mu.Lock()
	delete(r.opened, uid)
	r.mu.Unlock()
}

// storeHandler opens BackupStores and keeps the cluster's VolumeBackups in step with them.
type storeHandler struct {
	c          client.Client
	live       client.Reader
	pruneEvery time.Duration
	sync       time.Duration
	repos      *repos

	mu       sync.Mutex
	failures map[types.UID]int       // opens failed in a row, for the backoff
	pruned   map[types.UID]time.Time // last prune by this process
}

// Handle implements ipc.Handler.
func (h *storeHandler) Handle(ctx context.Context, s *storagev1alpha1.BackupStore) (ipc.Result, error) {
	repo, err := storeref.Open(ctx, h.live, s, true)
	if err != nil {
		h.repos.drop(s.UID)
		reason := "Unreachable"
		switch {
		case errors.Is(err, storeref.ErrSecret):
			reason = "SecretMissing"
		case errors.Is(err, backup.ErrWrongKey):
			reason = "WrongKey"
		}
		return ipc.Waiting(reason, err.Error(), h.backoff(s.UID)), nil
	}
	manifests, err := repo.Backups(ctx)
	if err != nil {
		h.repos.drop(s.UID)
		return ipc.Waiting("Unreachable", err.Error(), h.backoff(s.UID)), nil
	}
	h.repos.put(s, repo)
	h.mu.Lock()
	delete(h.failures, s.UID)
	h.mu.Unlock()
	s.Status.ChunkSize = int64(repo.ChunkSize())
	s.Status.LastChecked = &metav1.Time{Time: time.Now()}

	expired, err := h.retain(ctx, s, repo, manifests)
	if err != nil {
		return ipc.Result{}, err
	}
	manifests = slices.DeleteFunc(manifests, func(m *backup.Manifest) bool { return slices.Contains(expired, m.ID) })
	s.Status.Backups = int32(len(manifests))
	notes, err := h.discover(ctx, s, repo, manifests)
	if err != nil {
		return ipc.Result{}, err
	}
	if pruned, err := h.prune(ctx, s, repo, len(expired) > 0); err != nil {
		notes = append(notes, "pruning failed: "+err.Error())
	} else if pruned != "" {
		notes = append(notes, pruned)
	}
	msg := fmt.Sprintf("%d backups in %s", len(manifests), repo.Store())
	if len(expired) > 0 {
		msg += fmt.Sprintf("; %d deleted by the retention policy", len(expired))
	}
	if len(notes) > 0 {
		msg += "; " + strings.Join(notes, "; ")
	}
	res := ipc.Done(msg)
	res.RequeueAfter = h.sync
	return res, nil
}

// backoff is how long to wait before opening a store that failed to open again: 5 s, doubled
// for each failure in a row, at most 5 minutes.
func (h *storeHandler) backoff(uid types.UID) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failures == nil {
		h.failures = map[types.UID]int{}
	}
	n := h.failures[uid]
	h.failures[uid] = n + 1
	return min(5*time.Second<<min(n, 6), 5*time.Minute)
}

// retain deletes, from the store, the completed backups of each volume past the policy's
// keepLast (the oldest first), and the VolumeBackups of those. It returns their IDs.
func (h *storeHandler) retain(ctx context.Context, s *storagev1alpha1.BackupStore, repo *backup.Repository, manifests []*backup.Manifest) ([]string, error) {
	if s.Spec.Retention == nil || s.Spec.Retention.KeepLast == nil {
		return nil, nil
	}
	keep := int(*s.Spec.Retention.KeepLast)
	byVolume := map[string][]*backup.Manifest{}
	for _, m := range manifests {
		byVolume[m.Volume] = append(byVolume[m.Volume], m)
	}
	var expired []string
	for _, ms := range byVolume {
		slices.SortFunc(ms, func(a, b *backup.Manifest) int { return b.Created.Compare(a.Created) })
		for _, m := range ms[min(keep, len(ms)):] {
			if err := repo.Delete(ctx, m.ID); err != nil && !errors.Is(err, backup.ErrNotFound) {
				return nil, fmt.Errorf("deleting backup %s past the retention policy: %w", m.ID, err)
			}
			expired = append(expired, m.ID)
		}
	}
	if len(expired) == 0 {
		return nil, nil
	}
	backups, err := h.backupsOf(ctx, s.Name)
	if err != nil {
		return nil, err
	}
	for i := range backups {
		b := &backups[i]
		if slices.Contains(expired, backupID(b)) {
			if err := h.c.Delete(ctx, b, client.Preconditions{UID: &b.UID}); err != nil && !apierrors.IsNotFound(err) {
				return nil, fmt.Errorf("deleting VolumeBackup %s/%s past the retention policy: %w", b.Namespace, b.Name, err)
			}
		}
	}
	return expired, nil
}

// discover makes a VolumeBackup for each backup in the store that none stands for: backups
// made by another cluster, or by this one before it was rebuilt. Each goes where its manifest
// says it was made (namespace and name); one whose namespace does not exist, or whose name is
// taken, is left for a later sync and said so.
func (h *storeHandler) discover(ctx context.Context, s *storagev1alpha1.BackupStore, repo *backup.Repository, manifests []*backup.Manifest) ([]string, error) {
	backups, err := h.backupsOf(ctx, s.Name)
	if err != nil {
		return nil, err
	}
	// A backup is known only by a VolumeBackup of its own namespace: one that another
	// namespace made naming it (refused unless the store allows it) must not keep it from
	// its own.
	known := map[string]bool{}
	for i := range backups {
		b := &backups[i]
		known[b.Namespace+"/"+backupID(b)] = true
		known[b.Namespace+"/"+string(b.UID)] = true
	}
	var imported int
	var missingNS, taken []string
	for _, m := range manifests {
		ns, name := m.Labels[storeref.ManifestNamespace], m.Labels[storeref.ManifestName]
		if ns == "" || name == "" {
			continue // not made through a VolumeBackup: it belongs to no namespace
		}
		if known[ns+"/"+m.ID] {
			continue
		}
		var n corev1.Namespace
		if err := h.live.Get(ctx, client.ObjectKey{Name: ns}, &n); apierrors.IsNotFound(err) {
			missingNS = append(missingNS, ns+"/"+name)
			continue
		} else if err != nil {
			return nil, err
		}
		// Listed before the backups were: a backup deleted since (its manifest first, then
		// the object) must not come back.
		if _, err := repo.Manifest(ctx, m.ID); errors.Is(err, backup.ErrNotFound) {
			continue
		} else if err != nil {
			return nil, err
		}
		b := &storagev1alpha1.VolumeBackup{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: ns, Name: name,
				Annotations: map[string]string{storagev1alpha1.AnnotationBackupID: m.ID},
			},
			Spec: storagev1alpha1.VolumeBackupSpec{Store: s.Name},
		}
		switch err := h.c.Create(ctx, b); {
		case apierrors.IsAlreadyExists(err):
			taken = append(taken, ns+"/"+name)
		case err != nil:
			return nil, fmt.Errorf("creating VolumeBackup %s/%s for backup %s found in the store: %w", ns, name, m.ID, err)
		default:
			imported++
		}
	}
	var notes []string
	if imported > 0 {
		notes = append(notes, fmt.Sprintf("%d found in the store and added", imported))
	}
	if len(missingNS) > 0 {
		notes = append(notes, fmt.Sprintf("not added until their namespace exists: %s", strings.Join(missingNS, ", ")))
	}
	if len(taken) > 0 {
		notes = append(notes, fmt.Sprintf("not added, their name is taken by another backup: %s", strings.Join(taken, ", ")))
	}
	return notes, nil
}

// prune deletes the store's unreferenced chunks every pruneEvery, or now when backups were
// just deleted. A prune condemns first and deletes at a later one (backup.Prune).
func (h *storeHandler) prune(ctx context.Context, s *storagev1alpha1.BackupStore, repo *backup.Repository, now bool) (string, error) {
	h.mu.Lock()
	last, ok := h.pruned[s.UID]
	h.mu.Unlock()
	if !now && ok && time.Since(last) < h.pruneEvery {
		return "", nil
	}
	res, err := repo.Prune(ctx, backup.PruneOptions{})
	if err != nil {
		return "", err
	}
	h.mu.Lock()
	if h.pruned == nil {
		h.pruned = map[types.UID]time.Time{}
	}
	h.pruned[s.UID] = time.Now()
	h.mu.Unlock()
	if res.Deleted == 0 {
		return "", nil
	}
	return fmt.Sprintf("%d unreferenced chunks pruned", res.Deleted), nil
}

// backupsOf lists the VolumeBackups of store, in every namespace.
func (h *storeHandler) backupsOf(ctx context.Context, store string) ([]storagev1alpha1.VolumeBackup, error) {
	var list storagev1alpha1.VolumeBackupList
	if err := h.c.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing VolumeBackups: %w", err)
	}
	return slices.DeleteFunc(list.Items, func(b storagev1alpha1.VolumeBackup) bool { return b.Spec.Store != store }), nil
}

// backupID is the ID in its store of the backup b stands for. The annotation counts only on
// a backup without a source: one with a source is the backup it makes.
func backupID(b *storagev1alpha1.VolumeBackup) string {
	if id := b.Annotations[storagev1alpha1.AnnotationBackupID]; id != "" && b.Spec.Source == nil {
		return id
	}
	if b.Status.BackupID != "" {
		return b.Status.BackupID
	}
	return string(b.UID)
}

// storeToBackups maps a store to its backups: those waiting for it to open go on, and those
// found in it are judged again against its allowedNamespaces.
func (h *backupHandler) storeToBackups(ctx context.Context, o client.Object) []reconcile.Request {
	var list storagev1alpha1.VolumeBackupList
	if err := h.c.List(ctx, &list); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, b := range list.Items {
		if b.Spec.Store == o.GetName() && (b.Status.Phase != storagev1alpha1.BackupCompleted || b.Spec.Source == nil) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&b)})
		}
	}
	return reqs
}
