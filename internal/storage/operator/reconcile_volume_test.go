package operator

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

func TestSummarize(t *testing.T) {
	const (
		healthy = storagev1alpha1.ReplicaPhaseHealthy
		offline = storagev1alpha1.ReplicaPhaseOffline
		initial = storagev1alpha1.ReplicaPhase("")
	)
	pools := map[string]*storagev1alpha1.CStorPool{}
	for _, n := range []string{"p1", "p2", "p3"} {
		p := pool(n, "node-"+n, storagev1alpha1.PoolPhaseHealthy)
		pools[n] = &p
	}
	downPool := pool("p4", "node-p4", storagev1alpha1.PoolPhaseOffline)
	pools["p4"] = &downPool
	p5 := pool("p5", "node-p5", storagev1alpha1.PoolPhaseHealthy)
	pools["p5"] = &p5
	nodes := map[string]*corev1.Node{}
	for _, n := range []string{"p1", "p2", "p3", "p4", "p5"} {
		nodes["node-"+n] = readyNode("node-"+n, n != "p5") // p5's node is NotReady
	}
	v := placement{pools: pools, nodes: nodes}
	replicas := func(phases map[string]storagev1alpha1.ReplicaPhase) []storagev1alpha1.CStorVolumeReplica {
		var rs []storagev1alpha1.CStorVolumeReplica
		for p, phase := range phases {
			rs = append(rs, storagev1alpha1.CStorVolumeReplica{
				ObjectMeta: metav1.ObjectMeta{Name: "v-" + p},
				Spec:       storagev1alpha1.CStorVolumeReplicaSpec{Pool: p, NodeName: "node-" + p},
				Status:     storagev1alpha1.CStorVolumeReplicaStatus{Phase: phase},
			})
		}
		return rs
	}
	for _, tc := range []struct {
		name      string
		phases    map[string]storagev1alpha1.ReplicaPhase
		deleting  string
		wantPhase storagev1alpha1.VolumePhase
		wantReady int32
		ready     bool
		reason    string
		message   string
	}{
		{name: "all healthy", phases: map[string]storagev1alpha1.ReplicaPhase{"p1": healthy, "p2": healthy, "p3": healthy},
			wantPhase: storagev1alpha1.VolumePhaseHealthy, wantReady: 3, ready: true, message: "3 of 3 replicas healthy"},
		{name: "two of three placed", phases: map[string]storagev1alpha1.ReplicaPhase{"p1": healthy, "p2": healthy},
			wantPhase: storagev1alpha1.VolumePhaseDegraded, wantReady: 2, reason: conditions.ReasonWaiting,
			message: "2 of 3 replicas placed; waiting for 1 more pool"},
		{name: "one placed", phases: map[string]storagev1alpha1.ReplicaPhase{"p1": healthy},
			wantPhase: storagev1alpha1.VolumePhaseInit, wantReady: 1, reason: conditions.ReasonWaiting,
			message: "1 of 3 replicas placed; waiting for 2 more pools"},
		{name: "being created", phases: map[string]storagev1alpha1.ReplicaPhase{"p1": healthy, "p2": initial, "p3": initial},
			wantPhase: storagev1alpha1.VolumePhaseInit, wantReady: 1, reason: conditions.ReasonReconciling,
			message: "1 of 3 replicas healthy; 2 waiting for their node agents"},
		{name: "one offline", phases: map[string]storagev1alpha1.ReplicaPhase{"p1": healthy, "p2": healthy, "p3": offline},
			wantPhase: storagev1alpha1.VolumePhaseDegraded, wantReady: 2, reason: conditions.ReasonDegraded,
			message: "2 of 3 replicas healthy; v-p3 is Offline"},
		{name: "healthy replica on an offline pool counts as offline", phases: map[string]storagev1alpha1.ReplicaPhase{"p1": healthy, "p2": offline, "p4": healthy},
			wantPhase: storagev1alpha1.VolumePhaseOffline, wantReady: 1, reason: conditions.ReasonDegraded,
			message: "1 of 3 replicas healthy; v-p2 is Offline, v-p4 is Offline"},
		{name: "a healthy replica on a NotReady node counts as offline", phases: map[string]storagev1alpha1.ReplicaPhase{"p1": healthy, "p2": healthy, "p5": healthy},
			wantPhase: storagev1alpha1.VolumePhaseDegraded, wantReady: 2, reason: conditions.ReasonDegraded,
			message: "2 of 3 replicas healthy; v-p5 is Offline"},
		{name: "a rebuilding replica does not count", phases: map[string]storagev1alpha1.ReplicaPhase{"p1": healthy, "p2": healthy, "p3": storagev1alpha1.ReplicaPhaseRebuilding},
			wantPhase: storagev1alpha1.VolumePhaseDegraded, wantReady: 2, reason: conditions.ReasonDegraded,
			message: "2 of 3 replicas healthy; v-p3 is Rebuilding"},
		{name: "a replica being deleted does not serve", phases: map[string]storagev1alpha1.ReplicaPhase{"p1": healthy, "p2": healthy, "p3": healthy},
			deleting: "v-p3", wantPhase: storagev1alpha1.VolumePhaseDegraded, wantReady: 2, reason: conditions.ReasonDegraded,
			message: "2 of 3 replicas healthy; v-p3 is Offline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vol := &storagev1alpha1.CStorVolume{Spec: storagev1alpha1.CStorVolumeSpec{Capacity: resource.MustParse("1Gi"), ReplicationFactor: 3}}
			rs := replicas(tc.phases)
			for i := range rs {
				if rs[i].Name == tc.deleting {
					rs[i].DeletionTimestamp = &metav1.Time{Time: time.Now()}
				}
			}
			res := summarize(vol, 3, rs, v)
			if vol.Status.Phase != tc.wantPhase || vol.Status.ReadyReplicas != tc.wantReady || vol.Status.DesiredReplicas != 3 {
				t.Errorf("status %s %d/%d, want %s %d/3", vol.Status.Phase, vol.Status.ReadyReplicas, vol.Status.DesiredReplicas, tc.wantPhase, tc.wantReady)
			}
			if res.Ready != tc.ready || (!tc.ready && res.Reason != tc.reason) || res.Message != tc.message {
				t.Errorf("result %+v, want ready=%v reason %q message %q", res, tc.ready, tc.reason, tc.message)
			}
			if len(vol.Status.Replicas) != len(rs) {
				t.Errorf("%d replica entries", len(vol.Status.Replicas))
			}
			for i := 1; i < len(vol.Status.Replicas); i++ {
				if vol.Status.Replicas[i-1].Name > vol.Status.Replicas[i].Name {
					t.Errorf("replica entries not sorted: %v", vol.Status.Replicas)
				}
			}
		})
	}
}

// readyNode is a Node whose Ready condition is ready, turned an hour ago.
func readyNode(name string, ready bool) *corev1.Node {
	s := corev1.ConditionTrue
	if !ready {
		s = corev1.ConditionFalse
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: s, LastTransitionTime: metav1.NewTime(time.Now().Add(-time.Hour)),
		}}},
	}
}

func TestExpectationsCoverTheCacheLag(t *testing.T) {
	h := &volumeHandler{}
	vol := &storagev1alpha1.CStorVolume{ObjectMeta: metav1.ObjectMeta{UID: "v1", CreationTimestamp: metav1.Now()}}
	if !h.needLiveRead(vol) {
		t.Fatal("before the operator started, every volume needs a live read")
	}
	h.startedAt = time.Now().Add(-time.Minute)
	if h.needLiveRead(vol) {
		t.Fatal("a volume created after the operator started needs no live read")
	}
	old := vol.DeepCopy()
	old.CreationTimestamp = metav1.NewTime(h.startedAt)
	if !h.needLiveRead(old) {
		t.Fatal("a volume from before the operator started needs a live read")
	}

	r := storagev1alpha1.CStorVolumeReplica{ObjectMeta: metav1.ObjectMeta{Name: "v-p1"}}
	h.expect(vol.UID, &r)
	if got := h.withExpected(vol.UID, nil); len(got) != 1 || got[0].Name != "v-p1" {
		t.Fatalf("created but not cached: %v", got)
	}
	if got := h.withExpected(vol.UID, []storagev1alpha1.CStorVolumeReplica{r}); len(got) != 1 {
		t.Fatalf("created and cached: %d replicas", len(got))
	}
	if got := h.withExpected(vol.UID, nil); len(got) != 0 {
		t.Fatal("an expectation outlived the cache showing the replica")
	}

	h.markUncertain(vol.UID)
	if !h.needLiveRead(vol) || h.needLiveRead(vol) {
		t.Fatal("an uncertain create needs exactly one live read")
	}
}
