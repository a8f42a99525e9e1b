package driver

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// A snapshot's take outlives the call that started it, and waits its turn behind another
// operation on the volume: the CO cuts CreateVolume (a clone) and CreateSnapshot short and
// retries, and a take that ended with each call would start over every time and never
// finish on a volume that takes longer to copy than one call may last. Here the call ends
// while another operation holds the volume; once that is done, the take goes on without
// its caller and reports on the snapshot (the volume's status names a replica no object can
// have: the take fails fast, and says why).
func TestSnapshotTakeOutlivesItsCall(t *testing.T) {
	vol := &storagev1alpha1.CStorVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: "vol"},
		Status:     storagev1alpha1.CStorVolumeStatus{Replicas: []storagev1alpha1.VolumeReplicaStatus{{Name: "Not_A_Name"}}},
	}
	snap := &storagev1alpha1.CStorVolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: "snap", UID: "snap-uid"},
		Spec:       storagev1alpha1.CStorVolumeSnapshotSpec{Volume: vol.Name},
	}
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(vol, snap).WithStatusSubresource(snap).Build()
	d, err := New(Options{Client: c, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := d.lockVolume(vol.Name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = d.takeSnapshot(ctx, snap.DeepCopy())
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "still being taken") {
		t.Fatalf("take while the volume is busy, the call's deadline passed: %v, want DeadlineExceeded, still being taken", err)
	}
	unlock()

	wait.Eventually(t, 10*time.Second, "the take going on after its call ended", func(ctx context.Context) (bool, error) {
		got := &storagev1alpha1.CStorVolumeSnapshot{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(snap), got); err != nil {
			return false, err
		}
		cond := meta.FindStatusCondition(got.Status.Conditions, conditions.TypeReady)
		if cond == nil || cond.Status != metav1.ConditionFalse || !strings.Contains(cond.Message, "no valid object name") {
			return false, fmt.Errorf("Ready condition %+v", cond)
		}
		return true, nil
	})
}
