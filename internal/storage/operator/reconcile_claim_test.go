package operator

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

func node(name string, ready bool, labels map[string]string) corev1.Node {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}}},
	}
}

func TestEligibleNodesAndNewPools(t *testing.T) {
	ssd := map[string]string{"disk": "ssd"}
	cordoned := node("n5", true, ssd)
	cordoned.Spec.Unschedulable = true
	gone := node("n6", true, ssd)
	gone.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	nodes := []corev1.Node{node("n3", true, ssd), node("n1", true, ssd), node("n2", false, ssd), node("n4", true, nil), cordoned, gone, node("n0", true, ssd)}
	claim := &storagev1alpha1.StoragePoolClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "fast", UID: "uid-1"},
		Spec:       storagev1alpha1.StoragePoolClaimSpec{NodeSelector: ssd, Capacity: resource.MustParse("5Gi"), PoolType: storagev1alpha1.PoolTypeMirrored, Backend: storagev1alpha1.BackendFile},
	}
	eligible := eligibleNodes(claim, nodes)
	if want := []string{"n0", "n1", "n3"}; !slices.Equal(eligible, want) {
		t.Fatalf("eligible %v, want %v", eligible, want)
	}
	if got := newPoolNodes(claim, eligible, map[string]bool{"n1": true}); !slices.Equal(got, []string{"n0", "n3"}) {
		t.Fatalf("unlimited: %v", got)
	}
	claim.Spec.MaxPools = ptr.To(int32(2))
	if got := newPoolNodes(claim, eligible, map[string]bool{"n1": true}); !slices.Equal(got, []string{"n0"}) {
		t.Fatalf("maxPools 2 with one pool: %v", got)
	}
	// A pool on a node that is no longer eligible still counts against maxPools.
	if got := newPoolNodes(claim, eligible, map[string]bool{"n2": true, "n4": true}); len(got) != 0 {
		t.Fatalf("maxPools reached: %v", got)
	}

	p := newPool(claim, "n0")
	if p.Name != storagev1alpha1.PoolName("fast", "n0") || p.Spec.NodeName != "n0" || p.Spec.Claim != "fast" || p.Spec.PoolType != storagev1alpha1.PoolTypeMirrored ||
		p.Spec.Capacity.String() != "5Gi" {
		t.Fatalf("pool %+v", p)
	}
	if ref := metav1.GetControllerOf(p); ref == nil || ref.UID != "uid-1" || ref.Kind != "StoragePoolClaim" {
		t.Fatalf("owner %+v", p.OwnerReferences)
	}
}
