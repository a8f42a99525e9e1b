package bench

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// TestVolumeSteps: a step is done when the last of the volume's replicas gets there, other
// volumes' replicas and a stale Healthy (an older generation) do not count, and a step the
// replica watch had not delivered when the volume was Ready ends with the next.
func TestVolumeSteps(t *testing.T) {
	replica := func(name, volume string, phase storagev1alpha1.ReplicaPhase, gen, observed int64) *storagev1alpha1.CStorVolumeReplica {
		return &storagev1alpha1.CStorVolumeReplica{
			ObjectMeta: metav1.ObjectMeta{Name: name, Generation: gen},
			Spec:       storagev1alpha1.CStorVolumeReplicaSpec{Volume: volume},
			Status:     storagev1alpha1.CStorVolumeReplicaStatus{Phase: phase, ObservedGeneration: observed},
		}
	}
	s := newVolumeSteps("v", 2, time.Now())
	s.replica(replica("a", "v", "", 1, 0))
	s.replica(replica("x", "other", storagev1alpha1.ReplicaPhaseHealthy, 1, 1))
	if s.times.placed != 0 {
		t.Fatalf("placed after one of two replicas: %v", s.times)
	}
	s.replica(replica("b", "v", "", 1, 0))
	if s.times.placed == 0 {
		t.Fatal("not placed after both replicas")
	}
	s.replica(replica("a", "v", storagev1alpha1.ReplicaPhaseHealthy, 1, 1))
	s.replica(replica("b", "v", storagev1alpha1.ReplicaPhaseHealthy, 2, 1)) // status of the generation before
	if s.times.healthy != 0 {
		t.Fatalf("healthy with a stale status: %v", s.times)
	}
	s.replica(replica("b", "v", storagev1alpha1.ReplicaPhaseHealthy, 2, 2))
	s.ready(nil)
	if !(0 < s.times.placed && s.times.placed <= s.times.healthy && s.times.healthy <= s.times.ready) {
		t.Errorf("steps out of order: %+v", s.times)
	}

	late := newVolumeSteps("v", 3, time.Now())
	late.replica(replica("a", "v", "", 1, 0))
	late.ready(nil)
	if late.times.placed != late.times.ready || late.times.healthy != late.times.ready {
		t.Errorf("undelivered steps should end with Ready: %+v", late.times)
	}
	steps := storageSteps([]volumeTimes{{placed: 10 * time.Millisecond, healthy: 25 * time.Millisecond, ready: 30 * time.Millisecond}})
	if len(steps) != 3 || steps[0].P50Ms != 10 || steps[1].P50Ms != 15 || steps[2].P50Ms != 5 {
		t.Errorf("steps %+v, want 10, 15, 5 ms", steps)
	}
}
