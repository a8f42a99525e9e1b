package sidecar

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crdipc/crdipc/internal/csi/driver"
)

// Clone source protection. A clone's volume is filled from its source's volume while
// CreateVolume is retried, possibly for minutes (crdipc's driver snapshots the source first
// and deletes that snapshot once the clone is Ready). Deleting the source claim meanwhile
// would release its PV while the clone still needs it: the clone would wait for a source
// that is gone, forever Pending, and the snapshot taken for it would keep the source's
// volume from being deleted. So, as upstream's external-provisioner does, the source claim
// carries the finalizer FinalizerCloneSource while a clone is being provisioned from it: a
// deleted source stays Terminating until its clones are done, then goes.
//
// Upstream keeps the finalizer while any Pending claim names the source as its dataSource.
// crdipc records which claims it is provisioning from the source, in the annotation
// AnnotationClonesInProgress, written in the same optimistically locked patch as the
// finalizer, so that:
//   - a clone asked for while its source is being deleted is not started (and does not hold
//     the source: a Pending clone that never started would otherwise keep the source, and
//     itself, waiting forever), while one started before the deletion goes on;
//   - adding a clone and releasing the source never race: each rewrites the source's list
//     under its resourceVersion;
//   - a clone that is gone (deleted, or being deleted) before it was provisioned is known,
//     so the volume begun for it is deleted (DeleteVolume), with the driver's snapshot of
//     the source, even after a sidecar restart, which forgets what the library was doing.
//
// The sidecar's rights on claims (sidecar.go) include the patch this takes.
const (
	// FinalizerCloneSource is upstream's external-provisioner's finalizer on a claim that a
	// clone is being provisioned from, so tools that know it recognise it.
	FinalizerCloneSource = "provisioner.storage.kubernetes.io/cloning-protection"
	// AnnotationClonesInProgress on a source claim lists, comma-separated, the UIDs of the
	// claims being provisioned from it. The finalizer is removed with its last entry.
	AnnotationClonesInProgress = "csi.crdipc.io/clones-in-progress"
)

// cloneProtection keeps clones' sources (protect, on the provisioner's behalf) and releases
// them (Reconcile, for every claim listing clones, when one of them changes or goes).
type cloneProtection struct {
	c client.Client
	// live reads from the API server: what a source lists, and whether a PV exists, decide
	// writes and deletions the cache could be a moment behind on.
	live client.Reader
	csi  csi.ControllerClient
	o    Options
	log  logr.Logger
	// busy holds the clones a CreateVolume or a DeleteVolume is under way for: the
	// provisioner never asks for the volume of a clone while the reconciler deletes it.
	busy claimLocks
}

func (cp *cloneProtection) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("csi-clone-protection").
		// A claim listing clones is reconciled when it changes (its deletion included); a
		// clone brings its source: Bound, deleted or being deleted, it may release it.
		Watches(&corev1.PersistentVolumeClaim{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			pvc := o.(*corev1.PersistentVolumeClaim)
			var reqs []reconcile.Request
			if _, ok := pvc.Annotations[AnnotationClonesInProgress]; ok {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(pvc)})
			}
			if name, ok := cloneOf(pvc); ok {
				reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKey{Namespace: pvc.Namespace, Name: name}})
			}
			return reqs
		})).
		WithOptions(controller.Options{
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](cp.o.BackoffBase, cp.o.BackoffMax),
		}).
		Complete(cp)
}

// Reconcile implements reconcile.Reconciler for a source claim: the clones it lists that are
// no longer being provisioned are taken off the list (a Bound one as it is; one that is gone
// or being deleted once the volume begun for it is deleted), and with the last of them the
// finalizer.
func (cp *cloneProtection) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var src corev1.PersistentVolumeClaim
	if err := cp.c.Get(ctx, req.NamespacedName, &src); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if _, ok := src.Annotations[AnnotationClonesInProgress]; !ok {
		// Without the list the finalizer, if any, is not this sidecar's.
		return reconcile.Result{}, nil
	}
	var claims corev1.PersistentVolumeClaimList
	if err := cp.c.List(ctx, &claims, client.InNamespace(src.Namespace)); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing claims: %w", err)
	}
	byUID := map[types.UID]*corev1.PersistentVolumeClaim{}
	for i := range claims.Items {
		byUID[claims.Items[i].UID] = &claims.Items[i]
	}
	var (
		done    []types.UID
		waiting bool
	)
	for _, uid := range clonesInProgress(&src) {
		clone := byUID[uid]
		switch {
		case clone != nil && (clone.Status.Phase == corev1.ClaimBound || clone.Status.Phase == corev1.ClaimLost):
			// Provisioned: its volume is its PV's, deleted by its reclaim policy.
			done = append(done, uid)
		case clone != nil && clone.DeletionTimestamp.IsZero():
			// Still being provisioned.
		default:
			ok, err := cp.abandon(ctx, uid)
			if err != nil {
				return reconcile.Result{}, fmt.Errorf("clone %s of claim %s, gone before it was provisioned: %w", uid, req.NamespacedName, err)
			}
			if !ok {
				waiting = true
				continue
			}
			done = append(done, uid)
		}
	}
	if err := cp.drop(ctx, req.NamespacedName, done...); err != nil {
		return reconcile.Result{}, err
	}
	if waiting {
		return reconcile.Result{RequeueAfter: cp.o.BackoffBase}, nil
	}
	return reconcile.Result{}, nil
}

// protect records clone on its source from, adding the finalizer, before the clone's volume
// is asked for. A source being deleted takes no clone that it does not list already: a
// notYet error saying so (the clone is tried again with backoff, as upstream does; once the
// source is gone, it waits for a claim of that name like any clone of a missing claim).
func (cp *cloneProtection) protect(ctx context.Context, clone, from *corev1.PersistentVolumeClaim) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var src corev1.PersistentVolumeClaim
		if err := cp.live.Get(ctx, client.ObjectKeyFromObject(from), &src); err != nil {
			return err
		}
		if src.UID != from.UID {
			return waiting("claim %s/%s, the data source, was replaced while the clone was being started", from.Namespace, from.Name)
		}
		listed := slices.Contains(clonesInProgress(&src), clone.UID)
		switch {
		case listed && (controllerutil.ContainsFinalizer(&src, FinalizerCloneSource) || !src.DeletionTimestamp.IsZero()):
			return nil
		case !src.DeletionTimestamp.IsZero():
			return sourceDeleting(&src)
		}
		patch := client.MergeFromWithOptions(src.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(&src, FinalizerCloneSource)
		if !listed {
			setClonesInProgress(&src, append(clonesInProgress(&src), clone.UID))
		}
		return cp.c.Patch(ctx, &src, patch)
	})
	var wait *notYet
	switch {
	case err == nil || errors.As(err, &wait):
		return err
	case apierrors.IsNotFound(err):
		return waiting("claim %s/%s, the data source, does not exist (yet)", from.Namespace, from.Name)
	}
	return waiting("protecting claim %s/%s, the data source, with finalizer %s: %w", from.Namespace, from.Name, FinalizerCloneSource, err)
}

// sourceDeleting is the notYet error of a clone not started because its source is being
// deleted.
func sourceDeleting(src *corev1.PersistentVolumeClaim) error {
	return waiting("claim %s/%s, the data source, is being deleted: no clone is started from a claim being deleted", src.Namespace, src.Name)
}

// release undoes what was begun for clone, which the provisioner gave up on for good (a
// final CreateVolume error), and takes it off its source's list. The caller holds the
// clone's busy lock.
func (cp *cloneProtection) release(ctx context.Context, clone *corev1.PersistentVolumeClaim) error {
	name, ok := cloneOf(clone)
	if !ok {
		return nil
	}
	if _, err := cp.deleteBegun(ctx, clone.UID); err != nil {
		return err
	}
	return cp.drop(ctx, client.ObjectKey{Namespace: clone.Namespace, Name: name}, clone.UID)
}

// abandon deletes the volume begun for clone uid, which is gone or being deleted: false
// while a CreateVolume for it is under way (the caller comes back).
func (cp *cloneProtection) abandon(ctx context.Context, uid types.UID) (bool, error) {
	unlock, ok := cp.busy.tryLock(uid)
	if !ok {
		return false, nil
	}
	defer unlock()
	return cp.deleteBegun(ctx, uid)
}

// deleteBegun deletes the volume CreateVolume was asked to make for claim uid, unless it
// became a PV's (which its reclaim policy then decides on). A volume never made is no
// error: DeleteVolume of a missing volume succeeds, and crdipc's driver then deletes the
// snapshot of the source it may have taken for it.
func (cp *cloneProtection) deleteBegun(ctx context.Context, uid types.UID) (bool, error) {
	name := volumeName(uid)
	err := cp.live.Get(ctx, client.ObjectKey{Name: name}, &corev1.PersistentVolume{})
	if err == nil {
		return true, nil
	} else if !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("reading PV %s: %w", name, err)
	}
	id := driver.VolumeID(name)
	cctx, cancel := context.WithTimeout(ctx, cp.o.CallTimeout)
	defer cancel()
	if _, err := cp.csi.DeleteVolume(cctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		return false, fmt.Errorf("DeleteVolume %s: %w", id, err)
	}
	cp.log.Info("deleted the volume begun for a clone that is no longer wanted", "volume", id)
	return true, nil
}

// drop takes uids off the list of source key, and the finalizer with the last of them.
func (cp *cloneProtection) drop(ctx context.Context, key client.ObjectKey, uids ...types.UID) error {
	if len(uids) == 0 {
		return nil
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var src corev1.PersistentVolumeClaim
		if err := cp.live.Get(ctx, key, &src); err != nil {
			return client.IgnoreNotFound(err)
		}
		if _, ok := src.Annotations[AnnotationClonesInProgress]; !ok {
			return nil
		}
		have := clonesInProgress(&src)
		keep := slices.DeleteFunc(slices.Clone(have), func(u types.UID) bool { return slices.Contains(uids, u) })
		if len(keep) == len(have) && len(keep) > 0 {
			return nil
		}
		patch := client.MergeFromWithOptions(src.DeepCopy(), client.MergeFromWithOptimisticLock{})
		setClonesInProgress(&src, keep)
		if len(keep) == 0 {
			controllerutil.RemoveFinalizer(&src, FinalizerCloneSource)
		}
		return client.IgnoreNotFound(cp.c.Patch(ctx, &src, patch))
	})
	if err != nil {
		return fmt.Errorf("releasing claim %s from its clones %v: %w", key, uids, err)
	}
	return nil
}

// gone reports whether claim pvc no longer wants a volume: deleted (the library goes on
// with its last copy of a claim it was provisioning), replaced by another of its name, or
// being deleted.
func (cp *cloneProtection) gone(ctx context.Context, pvc *corev1.PersistentVolumeClaim) (bool, error) {
	var now corev1.PersistentVolumeClaim
	err := cp.live.Get(ctx, client.ObjectKeyFromObject(pvc), &now)
	if apierrors.IsNotFound(err) {
		return true, nil
	} else if err != nil {
		return false, fmt.Errorf("reading claim %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	return now.UID != pvc.UID || !now.DeletionTimestamp.IsZero(), nil
}

// cloneOf is the name of the claim that pvc clones, if it clones one of its namespace.
func cloneOf(pvc *corev1.PersistentVolumeClaim) (string, bool) {
	src, ok := dataSource(pvc)
	if !ok || src.group != "" || src.kind != "PersistentVolumeClaim" || src.namespace != pvc.Namespace || src.name == "" || src.name == pvc.Name {
		return "", false
	}
	return src.name, true
}

// volumeName is the name the library gives the PV of claim uid, which the provisioner also
// gives CreateVolume.
func volumeName(uid types.UID) string { return "pvc-" + string(uid) }

func clonesInProgress(pvc *corev1.PersistentVolumeClaim) []types.UID {
	var uids []types.UID
	for _, s := range strings.Split(pvc.Annotations[AnnotationClonesInProgress], ",") {
		if s = strings.TrimSpace(s); s != "" {
			uids = append(uids, types.UID(s))
		}
	}
	return uids
}

func setClonesInProgress(pvc *corev1.PersistentVolumeClaim, uids []types.UID) {
	if len(uids) == 0 {
		delete(pvc.Annotations, AnnotationClonesInProgress)
		return
	}
	s := make([]string, len(uids))
	for i, u := range uids {
		s[i] = string(u)
	}
	if pvc.Annotations == nil {
		pvc.Annotations = map[string]string{}
	}
	pvc.Annotations[AnnotationClonesInProgress] = strings.Join(s, ",")
}

// claimLocks is a set of claims some call is under way for.
type claimLocks struct {
	mu   sync.Mutex
	held map[types.UID]bool
}

// tryLock takes uid if no one holds it.
func (l *claimLocks) tryLock(uid types.UID) (unlock func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[uid] {
		return nil, false
	}
	if l.held == nil {
		l.held = map[types.UID]bool{}
	}
	l.held[uid] = true
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.held, uid)
	}, true
}
