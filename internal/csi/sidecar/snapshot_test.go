package sidecar_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	snapclientset "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/sidecar"
	"github.com/crdipc/crdipc/internal/csi/snapshotcontroller"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/simnode"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/storagecluster"
)

// Snapshots, restores and clones through the sidecar, against the real driver, storage and
// snapshot controller, each as its ServiceAccount: a VolumeSnapshot of a bound claim becomes
// ready to use (the sidecar's snapshotter calls CreateSnapshot; the driver's
// CStorVolumeSnapshot holds the copy); a claim restoring it asked for before it existed
// waits, saying so, and is provisioned from it once it is ready (CreateVolume's content
// source is the content's snapshot handle); a claim cloning the bound one is provisioned
// from its volume. Claims that can never be filled get one final ProvisioningFailed naming
// why, and no volume: smaller than the snapshot or the claim they copy, a claim of another
// driver, a data source of another kind. Deleting the VolumeSnapshot deletes its content and
// the CStorVolumeSnapshot. (The data restored and cloned is checked with pods in
// internal/csi/e2e.)
func TestSnapshotRestoreClone(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	cluster := storagecluster.Start(t, storagecluster.Options{Nodes: 1})
	pools := &storagev1alpha1.StoragePoolClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "snapshots"},
		Spec: storagev1alpha1.StoragePoolClaimSpec{MinPools: 1, Capacity: resource.MustParse("256Mi"), Backend: storagev1alpha1.BackendFile,
			NodeSelector: map[string]string{simnode.Label: "true"}},
	}
	cluster.PoolClaim(t, pools)

	// No node: the driver takes the snapshots of volumes staged nowhere itself, with a target
	// started for the copy (no block device, no mount).
	socket := serveDriver(t, env, driver.Options{})
	cm := testenv.NewManager(t, env.AsServiceAccount(t, "snapshot-controller"))
	if err := snapshotcontroller.Add(cm, snapshotcontroller.Options{RetryStart: 100 * time.Millisecond, RetryMax: time.Second}); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "snapshot-controller", cm.Start)
	log := &lines{}
	logger := log.logger()
	sm := testenv.NewManager(t, env.AsServiceAccount(t, "csi-sidecar"))
	if err := sidecar.Add(sm, sidecar.Options{DriverEndpoint: socket, DriverName: driver.Name, CallTimeout: 10 * time.Second,
		BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second, Resync: 200 * time.Millisecond, Logger: &logger}); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "sidecar", sm.Start)

	ns := env.Namespace(t)
	sc := &storagev1.StorageClass{
		ObjectMeta:    metav1.ObjectMeta{Name: "snapshots"},
		Provisioner:   driver.Name,
		Parameters:    map[string]string{driver.ParamReplicaCount: "1"},
		ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete),
	}
	if err := env.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sc) })
	snaps, err := snapclientset.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	vsc := &snapv1.VolumeSnapshotClass{ObjectMeta: metav1.ObjectMeta{Name: "snapshots-" + ns}, Driver: driver.Name, DeletionPolicy: snapv1.VolumeSnapshotContentDelete}
	if _, err := snaps.SnapshotV1().VolumeSnapshotClasses().Create(ctx, vsc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = snaps.SnapshotV1().VolumeSnapshotClasses().Delete(context.Background(), vsc.Name, metav1.DeleteOptions{})
	})
	// Registered last, so it runs first, while everything still runs: snapshots, claims and
	// their volumes go, then (PoolClaim's cleanup) the pools, and the next test of the
	// package finds none.
	t.Cleanup(func() {
		ctx := context.Background()
		if err := snaps.SnapshotV1().VolumeSnapshots(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Errorf("deleting the VolumeSnapshots: %v", err)
		}
		if err := env.Client.DeleteAllOf(ctx, &corev1.PersistentVolumeClaim{}, client.InNamespace(ns)); err != nil {
			t.Errorf("deleting the claims: %v", err)
		}
		testenv.Eventually(t, 60*time.Second, "the snapshots and volumes gone", func(ctx context.Context) (bool, error) {
			var vols storagev1alpha1.CStorVolumeList
			var ss storagev1alpha1.CStorVolumeSnapshotList
			if err := env.Client.List(ctx, &vols, client.InNamespace(install.SystemNamespace)); err != nil {
				return false, err
			}
			if err := env.Client.List(ctx, &ss, client.InNamespace(install.SystemNamespace)); err != nil {
				return false, err
			}
			if len(vols.Items) != 0 || len(ss.Items) != 0 {
				return false, fmt.Errorf("%d volumes, %d snapshots left", len(vols.Items), len(ss.Items))
			}
			return true, nil
		})
	})

	claim := func(name, size string, mutate func(*corev1.PersistentVolumeClaim)) *corev1.PersistentVolumeClaim {
		t.Helper()
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PersistentVolumeClaimSpec{
				StorageClassName: ptr.To(sc.Name),
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
			},
		}
		if mutate != nil {
			mutate(pvc)
		}
		if err := env.Client.Create(ctx, pvc); err != nil {
			t.Fatal(err)
		}
		return pvc
	}
	fromSnapshot := func(name string) func(*corev1.PersistentVolumeClaim) {
		return func(pvc *corev1.PersistentVolumeClaim) {
			pvc.Spec.DataSource = &corev1.TypedLocalObjectReference{APIGroup: ptr.To(snapv1.GroupName), Kind: "VolumeSnapshot", Name: name}
		}
	}
	fromClaim := func(name string) func(*corev1.PersistentVolumeClaim) {
		return func(pvc *corev1.PersistentVolumeClaim) {
			pvc.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: name}
		}
	}
	bound := func(pvc *corev1.PersistentVolumeClaim) *storagev1alpha1.CStorVolume {
		t.Helper()
		testenv.Eventually(t, 60*time.Second, "claim "+pvc.Name+" Bound", func(ctx context.Context) (bool, error) {
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
		return vol
	}
	// refused waits for the one final ProvisioningFailed Event holding want, then for the
	// sidecar to decline the unchanged claim twice more, and checks that it has no volume.
	refused := func(pvc *corev1.PersistentVolumeClaim, want string) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, "claim "+pvc.Name+" refused: "+want, func(ctx context.Context) (bool, error) {
			if n := countEvents(ctx, t, env.Client, pvc, want); n != 1 {
				return false, fmt.Errorf("%d such Events; all: %s", n, describeEvents(ctx, env.Client, pvc))
			}
			return true, nil
		})
		name, namespace := fmt.Sprintf("%q", pvc.Name), fmt.Sprintf("%q", ns) // as funcr writes them
		testenv.Eventually(t, 10*time.Second, "the sidecar declining claim "+pvc.Name+" twice", func(context.Context) (bool, error) {
			if n := log.count("not retrying a claim that failed for good", name, namespace); n < 2 {
				return false, fmt.Errorf("declined %d times", n)
			}
			return true, nil
		})
		if n := countEvents(ctx, t, env.Client, pvc, want); n != 1 {
			t.Errorf("claim %s: %d Events %q after the sidecar declined it, want 1", pvc.Name, n, want)
		}
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: "pvc-" + string(pvc.UID)}, &storagev1alpha1.CStorVolume{})
		if !apierrors.IsNotFound(err) {
			t.Errorf("claim %s refused, yet its volume: %v", pvc.Name, err)
		}
	}

	source := claim("source", "8Mi", nil)
	sourceVol := bound(source)

	// A raw block claim is provisioned as one (the library refuses block claims of a
	// provisioner that does not say it supports them), its PV in volume mode Block.
	block := claim("block", "8Mi", func(pvc *corev1.PersistentVolumeClaim) {
		pvc.Spec.VolumeMode = ptr.To(corev1.PersistentVolumeBlock)
	})
	bound(block)
	var blockPV corev1.PersistentVolume
	if err := env.Client.Get(ctx, client.ObjectKey{Name: block.Spec.VolumeName}, &blockPV); err != nil {
		t.Fatal(err)
	}
	if m := blockPV.Spec.VolumeMode; m == nil || *m != corev1.PersistentVolumeBlock {
		t.Errorf("PV %s of a block claim has volume mode %v", blockPV.Name, m)
	}

	// A restore asked for before its snapshot exists waits for it, saying so.
	early := claim("early", "8Mi", fromSnapshot("snap"))
	notYet := fmt.Sprintf("VolumeSnapshot %s/snap does not exist (yet)", ns)
	testenv.Eventually(t, 30*time.Second, "claim early waiting for its snapshot, twice", func(ctx context.Context) (bool, error) {
		if n := countEvents(ctx, t, env.Client, early, notYet); n < 2 {
			return false, fmt.Errorf("%d Events %q; all: %s", n, notYet, describeEvents(ctx, env.Client, early))
		}
		return true, nil
	})

	vs := &snapv1.VolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "snap"},
		Spec: snapv1.VolumeSnapshotSpec{
			Source:                  snapv1.VolumeSnapshotSource{PersistentVolumeClaimName: ptr.To(source.Name)},
			VolumeSnapshotClassName: ptr.To(vsc.Name),
		},
	}
	if vs, err = snaps.SnapshotV1().VolumeSnapshots(ns).Create(ctx, vs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "VolumeSnapshot snap ready to use", func(ctx context.Context) (bool, error) {
		if vs, err = snaps.SnapshotV1().VolumeSnapshots(ns).Get(ctx, vs.Name, metav1.GetOptions{}); err != nil {
			return false, err
		}
		if st := vs.Status; st == nil || st.ReadyToUse == nil || !*st.ReadyToUse {
			return false, fmt.Errorf("status %+v", st)
		}
		return true, nil
	})
	if rs := vs.Status.RestoreSize; rs == nil || rs.Cmp(resource.MustParse("8Mi")) != 0 {
		t.Errorf("restoreSize %v, want 8Mi", rs)
	}
	content, err := snaps.SnapshotV1().VolumeSnapshotContents().Get(ctx, *vs.Status.BoundVolumeSnapshotContentName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if content.Status == nil || content.Status.SnapshotHandle == nil {
		t.Fatalf("content %s has no snapshot handle: %+v", content.Name, content.Status)
	}
	handle := *content.Status.SnapshotHandle
	var css storagev1alpha1.CStorVolumeSnapshot
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: handle}, &css); err != nil {
		t.Fatalf("the CStorVolumeSnapshot named by the handle: %v", err)
	}
	if css.Spec.Volume != sourceVol.Name || !css.Status.ReadyToUse || len(css.Status.Copies) != 1 {
		t.Errorf("CStorVolumeSnapshot %s: volume %s, ready %v, copies %+v; want a ready copy of %s", css.Name, css.Spec.Volume, css.Status.ReadyToUse, css.Status.Copies, sourceVol.Name)
	}
	if want := "snapshot-" + string(vs.UID); css.Annotations[driver.AnnotationName] != want {
		t.Errorf("CStorVolumeSnapshot %s was asked for as %q, want %q (upstream's name of the snapshot)", css.Name, css.Annotations[driver.AnnotationName], want)
	}

	// The waiting restore goes on from the snapshot; its volume is filled from the copy.
	restored := bound(early)
	if restored.Spec.Source == nil || restored.Spec.Source.Snapshot != handle || restored.Annotations[driver.AnnotationContentSource] != "snapshot:"+handle {
		t.Errorf("restored volume %s: source %+v, annotation %q; want the snapshot %s", restored.Name, restored.Spec.Source, restored.Annotations[driver.AnnotationContentSource], handle)
	}

	clone := bound(claim("clone", "16Mi", fromClaim(source.Name)))
	if want := "volume:" + sourceVol.Name; clone.Annotations[driver.AnnotationContentSource] != want || clone.Spec.Source == nil {
		t.Errorf("cloned volume %s: source %+v, annotation %q; want filled from %s", clone.Name, clone.Spec.Source, clone.Annotations[driver.AnnotationContentSource], want)
	}

	t.Run("SmallerThanTheSnapshot", func(t *testing.T) {
		small := claim("restore-small", "4Mi", fromSnapshot(vs.Name))
		refused(small, fmt.Sprintf("the claim requests 4Mi, less than the 8Mi VolumeSnapshot %s/%s restores", ns, vs.Name))
		// A pending claim restoring a snapshot keeps it from being deleted (the snapshot
		// controller's finalizer), as upstream: this one never will be.
		if err := env.Client.Delete(ctx, small); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("SmallerThanTheClaim", func(t *testing.T) {
		refused(claim("clone-small", "4Mi", fromClaim(source.Name)), fmt.Sprintf("the claim requests 4Mi, less than the 8Mi of claim %s/%s it clones", ns, source.Name))
	})
	t.Run("AnotherDriversClaim", func(t *testing.T) {
		// A claim bound to a PV of another driver (made here, as its provisioner would).
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "foreign-" + ns},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("8Mi")},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				PersistentVolumeSource:        corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "other.example.com", VolumeHandle: "v1"}},
				ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: "foreign"},
			},
		}
		if err := env.Client.Create(ctx, pv); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), pv) })
		foreign := claim("foreign", "8Mi", func(pvc *corev1.PersistentVolumeClaim) {
			pvc.Spec.StorageClassName = ptr.To("")
			pvc.Spec.VolumeName = pv.Name
		})
		testenv.Eventually(t, 30*time.Second, "claim foreign Bound", func(ctx context.Context) (bool, error) {
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(foreign), foreign); err != nil {
				return false, err
			}
			if foreign.Status.Phase != corev1.ClaimBound {
				return false, fmt.Errorf("phase %q", foreign.Status.Phase)
			}
			return true, nil
		})
		refused(claim("foreign-clone", "8Mi", fromClaim(foreign.Name)),
			fmt.Sprintf(`claim %s/foreign is bound to PV %s, a volume of driver "other.example.com": %s clones only its own volumes`, ns, pv.Name, driver.Name))
	})
	t.Run("AnotherKind", func(t *testing.T) {
		refused(claim("widget", "8Mi", func(pvc *corev1.PersistentVolumeClaim) {
			pvc.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: ptr.To("example.com"), Kind: "Widget", Name: "w"}
		}), fmt.Sprintf("the claim's data source Widget.example.com %s/w is neither a VolumeSnapshot (snapshot.storage.k8s.io), a PersistentVolumeClaim nor a VolumeBackup (storage.crdipc.io)", ns))
	})

	// Deleting the VolumeSnapshot deletes its content and the driver's snapshot.
	if err := snaps.SnapshotV1().VolumeSnapshots(ns).Delete(ctx, vs.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the VolumeSnapshot, its content and the CStorVolumeSnapshot gone", func(ctx context.Context) (bool, error) {
		_, verr := snaps.SnapshotV1().VolumeSnapshots(ns).Get(ctx, vs.Name, metav1.GetOptions{})
		_, cerr := snaps.SnapshotV1().VolumeSnapshotContents().Get(ctx, content.Name, metav1.GetOptions{})
		serr := env.Client.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: handle}, &storagev1alpha1.CStorVolumeSnapshot{})
		if !apierrors.IsNotFound(verr) || !apierrors.IsNotFound(cerr) || !apierrors.IsNotFound(serr) {
			return false, fmt.Errorf("snapshot: %v; content: %v; CStorVolumeSnapshot: %v", verr, cerr, serr)
		}
		return true, nil
	})
}

// countEvents counts the Warning ProvisioningFailed Events on pvc whose message holds text.
func countEvents(ctx context.Context, t *testing.T, c client.Client, pvc *corev1.PersistentVolumeClaim, text string) int {
	t.Helper()
	var evs corev1.EventList
	if err := c.List(ctx, &evs, client.InNamespace(pvc.Namespace),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.uid", string(pvc.UID))}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if e.Type == corev1.EventTypeWarning && e.Reason == "ProvisioningFailed" && strings.Contains(e.Message, text) {
			n += int(max(e.Count, 1))
		}
	}
	return n
}

// describeEvents lists pvc's Events, for a failure message.
func describeEvents(ctx context.Context, c client.Client, pvc *corev1.PersistentVolumeClaim) string {
	var evs corev1.EventList
	if err := c.List(ctx, &evs, client.InNamespace(pvc.Namespace),
		client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.uid", string(pvc.UID))}); err != nil {
		return err.Error()
	}
	var s []string
	for _, e := range evs.Items {
		s = append(s, fmt.Sprintf("%s/%s x%d: %s", e.Type, e.Reason, max(e.Count, 1), e.Message))
	}
	return strings.Join(s, " | ")
}
