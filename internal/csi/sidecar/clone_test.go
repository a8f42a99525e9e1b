package sidecar_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
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
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/storagecluster"
)

// Clone source protection, against the real driver and storage, driver and sidecar each as
// its ServiceAccount. A clone of class "clone-held" (two replicas) stays in progress while
// there is one pool: the driver has snapshotted the source and made the clone's volume,
// which waits for a second pool, and CreateVolume is retried. Meanwhile:
//   - deleting the clone releases the source (no finalizer, no list) and leaves neither the
//     clone's volume nor the driver's snapshot of the source behind;
//   - deleting the source leaves it Terminating, kept by the finalizer, while the clone is
//     in progress; a clone asked for then is not started and says why; once the second pool
//     comes and the clone is Bound, the source, its PV and its volume go.
func TestCloneSourceProtection(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	cluster := storagecluster.Start(t, storagecluster.Options{Nodes: 2})
	pools := &storagev1alpha1.StoragePoolClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "clones"},
		Spec: storagev1alpha1.StoragePoolClaimSpec{MinPools: 1, MaxPools: ptr.To(int32(1)), Capacity: resource.MustParse("256Mi"),
			Backend: storagev1alpha1.BackendFile, NodeSelector: map[string]string{simnode.Label: "true"}},
	}
	cluster.PoolClaim(t, pools)

	socket := serveDriver(t, env, driver.Options{})
	sm := testenv.NewManager(t, env.AsServiceAccount(t, "csi-sidecar"))
	if err := sidecar.Add(sm, sidecar.Options{DriverEndpoint: socket, DriverName: driver.Name, CallTimeout: 5 * time.Second,
		BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second, Resync: 500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "sidecar", sm.Start)

	ns := env.Namespace(t)
	class := func(name string, replicas int) {
		sc := &storagev1.StorageClass{
			ObjectMeta:    metav1.ObjectMeta{Name: name},
			Provisioner:   driver.Name,
			Parameters:    map[string]string{driver.ParamReplicaCount: fmt.Sprint(replicas)},
			ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete),
		}
		if err := env.Client.Create(ctx, sc); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sc) })
	}
	class("clone-source", 1)
	class("clone-held", 2)
	// Registered after PoolClaim, so it runs first: claims and volumes go before the pools.
	t.Cleanup(func() {
		ctx := context.Background()
		if err := env.Client.DeleteAllOf(ctx, &corev1.PersistentVolumeClaim{}, client.InNamespace(ns)); err != nil {
			t.Errorf("deleting the claims: %v", err)
		}
		testenv.Eventually(t, 60*time.Second, "the snapshots and volumes gone", func(ctx context.Context) (bool, error) {
			vols, snaps := leftovers(ctx, env.Client)
			if len(vols) != 0 || len(snaps) != 0 {
				return false, fmt.Errorf("volumes %v, snapshots %v left", vols, snaps)
			}
			return true, nil
		})
	})

	claim := func(name, class string, from string) *corev1.PersistentVolumeClaim {
		t.Helper()
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{
				StorageClassName: ptr.To(class),
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("8Mi")}},
			},
		}
		if from != "" {
			pvc.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: from}
		}
		if err := env.Client.Create(ctx, pvc); err != nil {
			t.Fatal(err)
		}
		return pvc
	}
	// inProgress waits until the driver works on clone: its volume exists, waiting for a
	// second pool, and so does the snapshot of the source it is filled from.
	inProgress := func(clone *corev1.PersistentVolumeClaim) {
		t.Helper()
		testenv.Eventually(t, 60*time.Second, "clone "+clone.Name+" in progress", func(ctx context.Context) (bool, error) {
			vols, snaps := leftovers(ctx, env.Client)
			want := "pvc-" + string(clone.UID)
			if !slices.Contains(vols, want) || !slices.Contains(snaps, "clone-"+want) {
				return false, fmt.Errorf("volumes %v, snapshots %v; events: %s", vols, snaps, describeEvents(ctx, env.Client, clone))
			}
			return true, nil
		})
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(clone), clone); err != nil {
			t.Fatal(err)
		}
		if clone.Status.Phase != corev1.ClaimPending {
			t.Fatalf("clone %s is %s, want Pending while its volume waits for a second pool", clone.Name, clone.Status.Phase)
		}
	}
	// kept checks that source is kept for exactly clones (none: released).
	kept := func(source *corev1.PersistentVolumeClaim, clones ...*corev1.PersistentVolumeClaim) (bool, error) {
		var now corev1.PersistentVolumeClaim
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(source), &now); err != nil {
			return false, err
		}
		var want []string
		for _, c := range clones {
			want = append(want, string(c.UID))
		}
		has := slices.Contains(now.Finalizers, sidecar.FinalizerCloneSource)
		list := now.Annotations[sidecar.AnnotationClonesInProgress]
		if has != (len(clones) > 0) || list != strings.Join(want, ",") {
			return false, fmt.Errorf("finalizers %v, %s=%q; want the finalizer %v and %q", now.Finalizers, sidecar.AnnotationClonesInProgress, list, len(clones) > 0, strings.Join(want, ","))
		}
		return true, nil
	}

	source := claim("source", "clone-source", "")
	testenv.Eventually(t, 60*time.Second, "claim source Bound", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(source), source); err != nil {
			return false, err
		}
		if source.Status.Phase != corev1.ClaimBound {
			return false, fmt.Errorf("phase %q; events: %s", source.Status.Phase, describeEvents(ctx, env.Client, source))
		}
		return true, nil
	})
	sourcePV := source.Spec.VolumeName

	t.Run("CloneDeletedBeforeProvisioned", func(t *testing.T) {
		early := claim("early", "clone-held", source.Name)
		inProgress(early)
		testenv.Eventually(t, 10*time.Second, "the source kept for clone early", func(context.Context) (bool, error) { return kept(source, early) })
		if err := env.Client.Delete(ctx, early); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 60*time.Second, "the clone's volume and the snapshot taken for it gone", func(ctx context.Context) (bool, error) {
			vols, snaps := leftovers(ctx, env.Client)
			if slices.Contains(vols, "pvc-"+string(early.UID)) || len(snaps) != 0 {
				return false, fmt.Errorf("volumes %v, snapshots %v", vols, snaps)
			}
			return true, nil
		})
		testenv.Eventually(t, 10*time.Second, "the source released", func(context.Context) (bool, error) { return kept(source) })
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(source), source); err != nil || !source.DeletionTimestamp.IsZero() || source.Status.Phase != corev1.ClaimBound {
			t.Fatalf("source after its clone was deleted: %v, deletionTimestamp %v, phase %s; want it Bound", err, source.DeletionTimestamp, source.Status.Phase)
		}
	})

	t.Run("SourceDeletedWhileCloning", func(t *testing.T) {
		clone := claim("clone", "clone-held", source.Name)
		inProgress(clone)
		testenv.Eventually(t, 10*time.Second, "the source kept for clone clone", func(context.Context) (bool, error) { return kept(source, clone) })
		if err := env.Client.Delete(ctx, source); err != nil {
			t.Fatal(err)
		}
		terminating := func(t *testing.T) {
			t.Helper()
			testenv.Eventually(t, 10*time.Second, "the source Terminating, kept for clone clone", func(ctx context.Context) (bool, error) {
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(source), source); err != nil {
					return false, err
				}
				if source.DeletionTimestamp.IsZero() {
					return false, fmt.Errorf("not being deleted yet")
				}
				return kept(source, clone)
			})
		}
		terminating(t)

		// A clone asked for now is not started, and says why (with the source of class
		// clone-source, one pool would do: started, it would be Bound at once).
		late := claim("late", "clone-source", source.Name)
		deleting := fmt.Sprintf("claim %s/%s, the data source, is being deleted: no clone is started from a claim being deleted", ns, source.Name)
		testenv.Eventually(t, 30*time.Second, "claim late refused twice: "+deleting, func(ctx context.Context) (bool, error) {
			if n := countEvents(ctx, t, env.Client, late, deleting); n < 2 {
				return false, fmt.Errorf("%d such Events; all: %s", n, describeEvents(ctx, env.Client, late))
			}
			return true, nil
		})
		if vols, _ := leftovers(ctx, env.Client); slices.Contains(vols, "pvc-"+string(late.UID)) {
			t.Errorf("claim late has a volume though its source is being deleted")
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(late), late); err != nil || late.Status.Phase != corev1.ClaimPending {
			t.Errorf("claim late: %v, phase %s; want Pending", err, late.Status.Phase)
		}
		// The clone in progress still keeps it, and only it.
		terminating(t)

		// A second pool: the clone is Bound, and the source goes, with its PV and volume
		// (no snapshot left to keep it).
		patch := client.MergeFrom(pools.DeepCopy())
		pools.Spec.MaxPools = ptr.To(int32(2))
		if err := env.Client.Patch(ctx, pools, patch); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 2*time.Minute, "claim clone Bound", func(ctx context.Context) (bool, error) {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(clone), clone); err != nil {
				return false, err
			}
			if clone.Status.Phase != corev1.ClaimBound {
				return false, fmt.Errorf("phase %q; events: %s", clone.Status.Phase, describeEvents(ctx, env.Client, clone))
			}
			return true, nil
		})
		testenv.Eventually(t, 60*time.Second, "the source, its PV and its volume gone", func(ctx context.Context) (bool, error) {
			cerr := env.Client.Get(ctx, client.ObjectKeyFromObject(source), &corev1.PersistentVolumeClaim{})
			perr := env.Client.Get(ctx, client.ObjectKey{Name: sourcePV}, &corev1.PersistentVolume{})
			vols, snaps := leftovers(ctx, env.Client)
			if !apierrors.IsNotFound(cerr) || !apierrors.IsNotFound(perr) || slices.Contains(vols, sourcePV) || len(snaps) != 0 {
				return false, fmt.Errorf("claim: %v; PV: %v; volumes %v, snapshots %v", cerr, perr, vols, snaps)
			}
			return true, nil
		})
		// The refused clone waits for a claim of its source's name, as any clone of a
		// missing claim.
		missing := fmt.Sprintf("claim %s/%s, the data source, does not exist (yet)", ns, source.Name)
		testenv.Eventually(t, 30*time.Second, "claim late waiting for its source to exist", func(ctx context.Context) (bool, error) {
			if n := countEvents(ctx, t, env.Client, late, missing); n < 1 {
				return false, fmt.Errorf("no Event %q; all: %s", missing, describeEvents(ctx, env.Client, late))
			}
			return true, nil
		})
	})
}

// leftovers lists the names of the CStorVolumes and CStorVolumeSnapshots there are.
func leftovers(ctx context.Context, c client.Client) (vols, snaps []string) {
	var vl storagev1alpha1.CStorVolumeList
	var sl storagev1alpha1.CStorVolumeSnapshotList
	if err := c.List(ctx, &vl, client.InNamespace(install.SystemNamespace)); err != nil {
		return []string{err.Error()}, nil
	}
	if err := c.List(ctx, &sl, client.InNamespace(install.SystemNamespace)); err != nil {
		return nil, []string{err.Error()}
	}
	for _, v := range vl.Items {
		vols = append(vols, v.Name)
	}
	for _, s := range sl.Items {
		snaps = append(snaps, s.Name)
	}
	return vols, snaps
}
