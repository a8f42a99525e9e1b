package driver

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// A pure unit test: the health the driver reports for what the operator says of a volume
// (the staged target's view is tested in internal/csi/e2e). One entry per status and
// reason, each with a message a user can act on; nothing for a healthy volume.
func TestVolumeHealth(t *testing.T) {
	vol := func(phase storagev1alpha1.VolumePhase, ready int32, msg string, replicas ...storagev1alpha1.ReplicaPhase) *storagev1alpha1.CStorVolume {
		v := &storagev1alpha1.CStorVolume{ObjectMeta: metav1.ObjectMeta{Name: "v"}}
		v.Spec.ReplicationFactor = 3
		v.Status = storagev1alpha1.CStorVolumeStatus{Phase: phase, ReadyReplicas: ready, DesiredReplicas: 3}
		if msg != "" {
			v.Status.Conditions = []metav1.Condition{{Type: conditions.TypeReady, Status: metav1.ConditionFalse, Reason: "Waiting", Message: msg}}
		}
		for i, p := range replicas {
			v.Status.Replicas = append(v.Status.Replicas, storagev1alpha1.VolumeReplicaStatus{Name: "v-p" + string(rune('1'+i)), Node: "n" + string(rune('1'+i)), Phase: p})
		}
		return v
	}
	type entry struct {
		status         csi.VolumeHealthErrorType
		reason, substr string
	}
	for _, tc := range []struct {
		name string
		vol  *storagev1alpha1.CStorVolume
		want []entry
	}{
		{"healthy", vol(storagev1alpha1.VolumePhaseHealthy, 3, "", "Healthy", "Healthy", "Healthy"), nil},
		{"degraded", vol(storagev1alpha1.VolumePhaseDegraded, 2, "waiting for 1 more pool", "Healthy", "Healthy"),
			[]entry{{csi.VolumeHealthErrorType_DEGRADED, HealthDegraded, "2 of 3 replicas healthy: waiting for 1 more pool"}}},
		{"rebuilding", vol(storagev1alpha1.VolumePhaseDegraded, 2, "", "Healthy", "Rebuilding", "Rebuilding"),
			[]entry{
				{csi.VolumeHealthErrorType_DEGRADED, HealthDegraded, "2 of 3 replicas healthy"},
				{csi.VolumeHealthErrorType_DEGRADED, HealthRebuilding, "replica v-p2 on node n2 is being rebuilt; replica v-p3 on node n3"},
			}},
		{"offline", vol(storagev1alpha1.VolumePhaseOffline, 1, "", "Healthy", "Offline", "Offline"),
			[]entry{{csi.VolumeHealthErrorType_INACCESSIBLE, HealthOffline, "1 of 3 replicas healthy, fewer than the consistency factor 2"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := volumeHealth(tc.vol, nil)
			if h.GetVolumeId() != "v" || len(h.GetHealthStatuses()) != len(tc.want) {
				t.Fatalf("health %+v, want %d entries", h, len(tc.want))
			}
			for i, w := range tc.want {
				e := h.GetHealthStatuses()[i]
				if e.GetStatus() != w.status || e.GetReason() != w.reason || !strings.Contains(e.GetMessage(), w.substr) {
					t.Errorf("entry %d: %+v, want %s %s with %q", i, e, w.status, w.reason, w.substr)
				}
			}
		})
	}
}
