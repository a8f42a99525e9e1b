package snapshotcontroller_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	snapclientset "github.com/kubernetes-csi/external-snapshotter/client/v8/clientset/versioned"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/snapshotcontroller"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/metrics"
)

func TestMain(m *testing.M) {
	testenv.Main(m)
}

// A VolumeSnapshot of a bound claim gets a VolumeSnapshotContent naming the claim's CSI
// volume, made as the snapshot controller's own identity (the shipped role is enough); once
// the content is ready (the sidecar's part, played here), so is the snapshot; deleting the
// snapshot deletes the content (deletionPolicy Delete).
func TestSnapshotBindsToContent(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	mgr := testenv.NewManager(t, env.AsServiceAccount(t, "snapshot-controller"))
	if err := snapshotcontroller.Add(mgr, snapshotcontroller.Options{RetryStart: 100 * time.Millisecond, RetryMax: time.Second}); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "snapshot-controller", mgr.Start)
	snaps, err := snapclientset.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}

	ns := env.Namespace(t)
	class := &snapv1.VolumeSnapshotClass{
		ObjectMeta:     metav1.ObjectMeta{Name: "crdipc-" + ns},
		Driver:         driver.Name,
		DeletionPolicy: snapv1.VolumeSnapshotContentDelete,
	}
	if _, err := snaps.SnapshotV1().VolumeSnapshotClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = snaps.SnapshotV1().VolumeSnapshotClasses().Delete(context.Background(), class.Name, metav1.DeleteOptions{})
	})
	pvc, pv := boundClaim(t, kube, ns, "data", "pvc-"+ns+"-data")

	snap := &snapv1.VolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "before-upgrade"},
		Spec: snapv1.VolumeSnapshotSpec{
			Source:                  snapv1.VolumeSnapshotSource{PersistentVolumeClaimName: ptr.To(pvc.Name)},
			VolumeSnapshotClassName: ptr.To(class.Name),
		},
	}
	if snap, err = snaps.SnapshotV1().VolumeSnapshots(ns).Create(ctx, snap, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var content *snapv1.VolumeSnapshotContent
	testenv.Eventually(t, 30*time.Second, "a content for the snapshot", func(ctx context.Context) (bool, error) {
		s, err := snaps.SnapshotV1().VolumeSnapshots(ns).Get(ctx, snap.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if s.Status == nil || s.Status.BoundVolumeSnapshotContentName == nil {
			return false, fmt.Errorf("snapshot status: %+v", s.Status)
		}
		content, err = snaps.SnapshotV1().VolumeSnapshotContents().Get(ctx, *s.Status.BoundVolumeSnapshotContentName, metav1.GetOptions{})
		return err == nil, err
	})
	if content.Spec.Driver != driver.Name || content.Spec.Source.VolumeHandle == nil || *content.Spec.Source.VolumeHandle != pv.Spec.CSI.VolumeHandle ||
		content.Spec.VolumeSnapshotRef.UID != snap.UID || content.Spec.DeletionPolicy != snapv1.VolumeSnapshotContentDelete {
		t.Fatalf("content %s: driver %s, source %v, snapshot ref %+v, policy %s", content.Name, content.Spec.Driver,
			content.Spec.Source.VolumeHandle, content.Spec.VolumeSnapshotRef, content.Spec.DeletionPolicy)
	}

	// The sidecar's part: the driver took the snapshot.
	now := time.Now().UnixNano()
	content.Status = &snapv1.VolumeSnapshotContentStatus{
		SnapshotHandle: ptr.To("snap-1"), CreationTime: &now, ReadyToUse: ptr.To(true), RestoreSize: ptr.To(int64(64 << 20)),
	}
	if _, err := snaps.SnapshotV1().VolumeSnapshotContents().UpdateStatus(ctx, content, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the snapshot ready to use", func(ctx context.Context) (bool, error) {
		s, err := snaps.SnapshotV1().VolumeSnapshots(ns).Get(ctx, snap.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if s.Status == nil || s.Status.ReadyToUse == nil || !*s.Status.ReadyToUse || s.Status.RestoreSize == nil || s.Status.RestoreSize.Cmp(resource.MustParse("64Mi")) != 0 {
			return false, fmt.Errorf("snapshot status: %+v", s.Status)
		}
		return true, nil
	})
	// Upstream's operation metrics are served with the process's own: the snapshot's
	// creation up to ready to use was timed, and nothing of upstream's registry but its
	// snapshot_controller_ families came along.
	testenv.Eventually(t, 10*time.Second, "the snapshot's creation timed", func(ctx context.Context) (bool, error) {
		fams := metrics.Gather(t, ctrlmetrics.Registry)
		n := fams.Sum("snapshot_controller_operation_total_seconds_count",
			map[string]string{"driver_name": driver.Name, "operation_name": "CreateSnapshotAndReady", "operation_status": "success"})
		if n < 1 {
			return false, fmt.Errorf("snapshot_controller_ families: %s", fams.Format("snapshot_controller_operation_total_seconds"))
		}
		if _, ok := fams.Sample("snapshot_controller_operations_in_flight", nil); !ok {
			return false, errors.New("no snapshot_controller_operations_in_flight")
		}
		return true, nil
	})

	if err := snaps.SnapshotV1().VolumeSnapshots(ns).Delete(ctx, snap.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The content waits for the sidecar (its finalizer is the sidecar's, not set here) to
	// delete the snapshot: the controller marks it for deletion.
	testenv.Eventually(t, 30*time.Second, "the content deleted with the snapshot", func(ctx context.Context) (bool, error) {
		c, err := snaps.SnapshotV1().VolumeSnapshotContents().Get(ctx, content.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		if c.DeletionTimestamp != nil {
			return true, nil
		}
		return false, errors.New("content not deleted yet")
	})
}

// boundClaim makes a claim bound to a PV of the crdipc driver, as the provisioner and the PV
// binder would leave them.
func boundClaim(t *testing.T, kube kubernetes.Interface, ns, name, handle string) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	t.Helper()
	ctx := context.Background()
	size := resource.MustParse("64Mi")
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			VolumeName:  handle, StorageClassName: ptr.To(""),
		},
	}
	pvc, err := kube.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: handle},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			ClaimRef:                      &corev1.ObjectReference{Namespace: ns, Name: name, UID: pvc.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driver.Name, VolumeHandle: handle,
			}},
		},
	}
	if pv, err = kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.CoreV1().PersistentVolumes().Delete(context.Background(), pv.Name, metav1.DeleteOptions{})
	})
	pvc.Status.Phase = corev1.ClaimBound
	pvc.Status.Capacity = corev1.ResourceList{corev1.ResourceStorage: size}
	if pvc, err = kube.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return pvc, pv
}
