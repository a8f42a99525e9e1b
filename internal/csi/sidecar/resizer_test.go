package sidecar_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/sidecar"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/simnode"
	"github.com/crdipc/crdipc/internal/testenv"
	testmetrics "github.com/crdipc/crdipc/internal/testenv/metrics"
	"github.com/crdipc/crdipc/internal/testenv/storagecluster"
)

// A bound claim whose request is raised is expanded as upstream's external-resizer does:
// ControllerExpandVolume grows the CStorVolume (the operator grows its replica), the PV's
// capacity becomes the new size, and the claim is left for the node (status.capacity still
// the old size, allocatedResources the new one, allocatedResourceStatuses NodeResizePending,
// condition FileSystemResizePending), with the Events Resizing and FileSystemResizeRequired.
// A growth past what the replica's pool holds is refused by the driver before the volume
// changes: a Warning VolumeResizeFailed naming the pool, ControllerResizeInfeasible and
// ControllerResizeError on the claim, and no retry until the claim changes. A shrink is
// refused by the API server. Driver and sidecar run as their ServiceAccounts, over a real
// Unix socket.
func TestExpansion(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	cluster := storagecluster.Start(t, storagecluster.Options{Nodes: 1})
	claim := &storagev1alpha1.StoragePoolClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "resizer"},
		Spec: storagev1alpha1.StoragePoolClaimSpec{MinPools: 1, Capacity: resource.MustParse("256Mi"), Backend: storagev1alpha1.BackendFile,
			NodeSelector: map[string]string{simnode.Label: "true"}},
	}
	cluster.PoolClaim(t, claim)

	reg := prometheus.NewRegistry()
	socket := serveDriver(t, env, driver.Options{Registerer: reg})
	log := &lines{}
	logger := log.logger()
	sm := testenv.NewManager(t, env.AsServiceAccount(t, "csi-sidecar"))
	if err := sidecar.Add(sm, sidecar.Options{DriverEndpoint: socket, DriverName: driver.Name, CallTimeout: 10 * time.Second,
		BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second, Resync: 100 * time.Millisecond, Logger: &logger}); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "sidecar", sm.Start)
	sc := &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: "resizer"},
		Provisioner:          driver.Name,
		Parameters:           map[string]string{driver.ParamReplicaCount: "1"},
		ReclaimPolicy:        ptr.To(corev1.PersistentVolumeReclaimDelete),
		AllowVolumeExpansion: ptr.To(true),
	}
	if err := env.Client.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), sc) })

	ns := env.Namespace(t)
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "grows"},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To(sc.Name),
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("8Mi")}},
		},
	}
	if err := env.Client.Create(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	// Registered last, so it runs first, while the sidecar and the storage still run: the
	// volume goes, then (PoolClaim's cleanup) the pool, and the next test of the package
	// finds neither.
	t.Cleanup(func() {
		ctx := context.Background()
		if err := env.Client.Delete(ctx, pvc); client.IgnoreNotFound(err) != nil {
			t.Errorf("deleting the claim: %v", err)
		}
		testenv.Eventually(t, 60*time.Second, "the volume gone", func(ctx context.Context) (bool, error) {
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
	testenv.Eventually(t, 60*time.Second, "the claim Bound", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
			return false, err
		}
		if pvc.Status.Phase != corev1.ClaimBound {
			return false, fmt.Errorf("phase %q", pvc.Status.Phase)
		}
		return true, nil
	})
	pvName := pvc.Spec.VolumeName
	request := func(size string) error {
		return env.Client.Patch(ctx, pvc, client.RawPatch(types.MergePatchType,
			[]byte(fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, size))))
	}
	events := func(ctx context.Context) ([]corev1.Event, error) {
		var evs corev1.EventList
		err := env.Client.List(ctx, &evs, client.InNamespace(ns),
			client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("involvedObject.uid", string(pvc.UID))})
		return evs.Items, err
	}
	hasEvent := func(evs []corev1.Event, typ, reason, text string) bool {
		for _, e := range evs {
			if e.Type == typ && e.Reason == reason && strings.Contains(e.Message, text) {
				return true
			}
		}
		return false
	}
	describe := func(evs []corev1.Event) string {
		var s []string
		for _, e := range evs {
			s = append(s, e.Type+"/"+e.Reason+": "+e.Message)
		}
		return strings.Join(s, " | ")
	}

	if err := request("16Mi"); err != nil {
		t.Fatal(err)
	}
	sixteen := resource.MustParse("16Mi")
	testenv.Eventually(t, 60*time.Second, "the claim's expansion handed to the node", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
			return false, err
		}
		if pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] != corev1.PersistentVolumeClaimNodeResizePending {
			return false, fmt.Errorf("allocatedResourceStatuses %v, conditions %+v", pvc.Status.AllocatedResourceStatuses, pvc.Status.Conditions)
		}
		return true, nil
	})
	if a := pvc.Status.AllocatedResources[corev1.ResourceStorage]; a.Cmp(sixteen) != 0 {
		t.Errorf("allocatedResources storage %s, want 16Mi", a.String())
	}
	if c := pvc.Status.Capacity[corev1.ResourceStorage]; c.String() != "8Mi" {
		t.Errorf("status.capacity %s before the node grew the file system, want 8Mi", c.String())
	}
	if conds := resizeConditions(pvc); len(conds) != 1 || conds[0].Type != corev1.PersistentVolumeClaimFileSystemResizePending ||
		conds[0].Status != corev1.ConditionTrue || !strings.Contains(conds[0].Message, "file system resize") {
		t.Errorf("conditions %+v, want FileSystemResizePending as the only resize condition", pvc.Status.Conditions)
	}
	var pv corev1.PersistentVolume
	if err := env.Client.Get(ctx, client.ObjectKey{Name: pvName}, &pv); err != nil {
		t.Fatal(err)
	}
	if c := pv.Spec.Capacity[corev1.ResourceStorage]; c.Cmp(sixteen) != 0 {
		t.Errorf("PV capacity %s, want 16Mi", c.String())
	}
	var vol storagev1alpha1.CStorVolume
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: pvName}, &vol); err != nil {
		t.Fatal(err)
	}
	if vol.Spec.Capacity.Cmp(sixteen) != 0 || vol.Status.Capacity == nil || vol.Status.Capacity.Cmp(sixteen) != 0 {
		t.Errorf("CStorVolume capacity %s, status.capacity %v: want 16Mi grown", vol.Spec.Capacity.String(), vol.Status.Capacity)
	}
	testenv.Eventually(t, 20*time.Second, "the Events Resizing and FileSystemResizeRequired", func(ctx context.Context) (bool, error) {
		evs, err := events(ctx)
		if err != nil {
			return false, err
		}
		if !hasEvent(evs, corev1.EventTypeNormal, sidecar.EventResizing, "External resizer is resizing volume "+pvName) ||
			!hasEvent(evs, corev1.EventTypeNormal, sidecar.EventFileSystemResizeRequired, "Require file system resize of volume on node") {
			return false, fmt.Errorf("events: %s", describe(evs))
		}
		return true, nil
	})
	ok := testmetrics.Gather(t, reg).Sum("crdipc_csi_operations_seconds_count", map[string]string{"method": "ControllerExpandVolume", "grpc_status_code": "OK"})
	if ok < 1 {
		t.Errorf("%v ControllerExpandVolume calls answered OK, want at least 1", ok)
	}

	// The node's part, done here as the kubelet would: the file system has grown.
	done := pvc.DeepCopy()
	done.Status.Capacity[corev1.ResourceStorage] = sixteen
	done.Status.AllocatedResourceStatuses = nil
	done.Status.Conditions = nil
	for _, c := range pvc.Status.Conditions {
		if c.Type != corev1.PersistentVolumeClaimFileSystemResizePending {
			done.Status.Conditions = append(done.Status.Conditions, c)
		}
	}
	if err := env.Client.Status().Patch(ctx, done, client.MergeFrom(pvc)); err != nil {
		t.Fatal(err)
	}

	// Larger than the replica's pool: refused before the volume changes, not retried.
	if err := request("512Mi"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the expansion refused for good", func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
			return false, err
		}
		evs, err := events(ctx)
		if err != nil {
			return false, err
		}
		if !hasEvent(evs, corev1.EventTypeWarning, sidecar.EventVolumeResizeFailed, "cannot grow to 512Mi") {
			return false, fmt.Errorf("events: %s", describe(evs))
		}
		if pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] != corev1.PersistentVolumeClaimControllerResizeInfeasible {
			return false, fmt.Errorf("allocatedResourceStatuses %v", pvc.Status.AllocatedResourceStatuses)
		}
		return true, nil
	})
	var resizeErr *corev1.PersistentVolumeClaimCondition
	for i, c := range pvc.Status.Conditions {
		if c.Type == corev1.PersistentVolumeClaimControllerResizeError {
			resizeErr = &pvc.Status.Conditions[i]
		}
	}
	if resizeErr == nil || !strings.Contains(resizeErr.Message, "which holds 256Mi in all") {
		t.Errorf("conditions %+v: want ControllerResizeError naming the pool's size", pvc.Status.Conditions)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: pvName}, &vol); err != nil {
		t.Fatal(err)
	}
	if vol.Spec.Capacity.Cmp(sixteen) != 0 {
		t.Errorf("CStorVolume capacity %s after a refused growth, want 16Mi still", vol.Spec.Capacity.String())
	}
	outOfRange := func() float64 {
		return testmetrics.Gather(t, reg).Sum("crdipc_csi_operations_seconds_count", map[string]string{"method": "ControllerExpandVolume", "grpc_status_code": "OutOfRange"})
	}
	// Its PV changing brings the claim back to the resizer, which declines it.
	if err := env.Client.Patch(ctx, &pv, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"touched":"yes"}}}`))); err != nil {
		t.Fatal(err)
	}
	name, namespace := fmt.Sprintf("%q", pvc.Name), fmt.Sprintf("%q", ns) // as funcr writes them
	testenv.Eventually(t, 10*time.Second, "the resizer declining the unchanged claim twice", func(context.Context) (bool, error) {
		if n := log.count("not retrying an expansion that failed for good", name, namespace); n < 2 {
			return false, fmt.Errorf("declined %d times", n)
		}
		return true, nil
	})
	if n := outOfRange(); n != 1 {
		t.Errorf("%v ControllerExpandVolume calls answered OutOfRange, want 1: the unchanged claim was retried", n)
	}

	// Shrinking is the API server's to refuse.
	err := request("4Mi")
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "can not be less than status.capacity") {
		t.Errorf("shrinking the claim to 4Mi: %v, want Invalid: can not be less than status.capacity", err)
	}
}

// resizeConditions are the conditions of pvc that resizers write (the control plane adds
// others, such as Unused).
func resizeConditions(pvc *corev1.PersistentVolumeClaim) []corev1.PersistentVolumeClaimCondition {
	var out []corev1.PersistentVolumeClaimCondition
	for _, c := range pvc.Status.Conditions {
		switch c.Type {
		case corev1.PersistentVolumeClaimResizing, corev1.PersistentVolumeClaimFileSystemResizePending,
			corev1.PersistentVolumeClaimControllerResizeError, corev1.PersistentVolumeClaimNodeResizeError:
			out = append(out, c)
		}
	}
	return out
}
