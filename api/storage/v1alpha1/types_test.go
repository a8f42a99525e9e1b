package v1alpha1_test

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/crdipc/crdipc/api/conditions"
	"github.com/crdipc/crdipc/api/storage/v1alpha1"
)

func TestDeepCopy(t *testing.T) {
	maxPools := int32(3)
	cf := int32(2)
	objs := []interface {
		runtime.Object
		conditions.Object
	}{
		&v1alpha1.StoragePoolClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "c"},
			Spec: v1alpha1.StoragePoolClaimSpec{
				PoolType: v1alpha1.PoolTypeMirrored, MinPools: 1, MaxPools: &maxPools,
				NodeSelector: map[string]string{"zone": "a"}, Capacity: resource.MustParse("10Gi"),
				Backend: v1alpha1.BackendFile,
			},
		},
		&v1alpha1.CStorPool{
			ObjectMeta: metav1.ObjectMeta{Name: "c-node-1"},
			Spec:       v1alpha1.CStorPoolSpec{NodeName: "node-1", Claim: "c", Capacity: resource.MustParse("10Gi")},
			Status: v1alpha1.CStorPoolStatus{Phase: v1alpha1.PoolPhaseHealthy, Capacity: &v1alpha1.PoolCapacity{
				Total: resource.MustParse("10Gi"), Used: resource.MustParse("1Gi"), Free: resource.MustParse("9Gi"),
			}},
		},
		&v1alpha1.CStorVolume{
			ObjectMeta: metav1.ObjectMeta{Name: "v", Namespace: "default"},
			Spec:       v1alpha1.CStorVolumeSpec{Capacity: resource.MustParse("1Gi"), ReplicationFactor: 3, ConsistencyFactor: &cf},
			Status: v1alpha1.CStorVolumeStatus{Replicas: []v1alpha1.VolumeReplicaStatus{
				{Name: "v-c-node-1", Pool: "c-node-1", Node: "node-1", Phase: v1alpha1.ReplicaPhaseHealthy},
			}},
		},
		&v1alpha1.CStorVolumeReplica{
			ObjectMeta: metav1.ObjectMeta{Name: "v-c-node-1", Namespace: "default"},
			Spec:       v1alpha1.CStorVolumeReplicaSpec{Volume: "v", Pool: "c-node-1", NodeName: "node-1", Capacity: resource.MustParse("1Gi")},
			Status:     v1alpha1.CStorVolumeReplicaStatus{Capacity: &v1alpha1.ReplicaCapacity{Total: resource.MustParse("1Gi")}},
		},
	}
	for _, orig := range objs {
		orig.SetConditions([]metav1.Condition{{Type: conditions.TypeReady, Reason: conditions.ReasonSucceeded}})
		orig.SetObservedGeneration(1)
		cp := orig.DeepCopyObject()
		if reflect.TypeOf(cp) != reflect.TypeOf(orig) {
			t.Fatalf("DeepCopyObject(%T) returned %T", orig, cp)
		}
		if !equality.Semantic.DeepEqual(orig, cp) {
			t.Fatalf("%T: copy differs from original", orig)
		}
		cp.(conditions.Object).GetConditions()[0].Reason = conditions.ReasonFailed
		if orig.GetConditions()[0].Reason != conditions.ReasonSucceeded {
			t.Fatalf("%T: copy shares conditions with original", orig)
		}
	}

	spc := objs[0].(*v1alpha1.StoragePoolClaim)
	spcCopy := spc.DeepCopy()
	*spcCopy.Spec.MaxPools = 9
	spcCopy.Spec.NodeSelector["zone"] = "b"
	if *spc.Spec.MaxPools != 3 || spc.Spec.NodeSelector["zone"] != "a" {
		t.Fatal("StoragePoolClaim copy shares spec with original")
	}
	pool := objs[1].(*v1alpha1.CStorPool)
	poolCopy := pool.DeepCopy()
	poolCopy.Status.Capacity.Free = resource.MustParse("1Gi")
	if pool.Status.Capacity.Free.String() != "9Gi" {
		t.Fatal("CStorPool copy shares status capacity with original")
	}
	vol := objs[2].(*v1alpha1.CStorVolume)
	volCopy := vol.DeepCopy()
	volCopy.Status.Replicas[0].Phase = v1alpha1.ReplicaPhaseError
	*volCopy.Spec.ConsistencyFactor = 1
	if vol.Status.Replicas[0].Phase != v1alpha1.ReplicaPhaseHealthy || *vol.Spec.ConsistencyFactor != 2 {
		t.Fatal("CStorVolume copy shares memory with original")
	}
}

func TestEffectiveConsistencyFactor(t *testing.T) {
	one := int32(1)
	for _, tc := range []struct {
		spec v1alpha1.CStorVolumeSpec
		want int32
	}{
		{v1alpha1.CStorVolumeSpec{ReplicationFactor: 1}, 1},
		{v1alpha1.CStorVolumeSpec{ReplicationFactor: 2}, 2},
		{v1alpha1.CStorVolumeSpec{ReplicationFactor: 3}, 2},
		{v1alpha1.CStorVolumeSpec{ReplicationFactor: 4}, 3},
		{v1alpha1.CStorVolumeSpec{ReplicationFactor: 5}, 3},
		{v1alpha1.CStorVolumeSpec{}, 2}, // not yet defaulted: rf counts as 3
		{v1alpha1.CStorVolumeSpec{ReplicationFactor: 5, ConsistencyFactor: &one}, 1},
	} {
		if got := tc.spec.EffectiveConsistencyFactor(); got != tc.want {
			t.Errorf("rf=%d cf=%v: EffectiveConsistencyFactor() = %d, want %d",
				tc.spec.ReplicationFactor, tc.spec.ConsistencyFactor, got, tc.want)
		}
	}
}

func TestEffectiveReplicationFactor(t *testing.T) {
	for _, tc := range []struct {
		rf, want int32
	}{
		{0, v1alpha1.DefaultReplicationFactor}, // not yet defaulted by the API server
		{1, 1},
		{5, 5},
	} {
		spec := v1alpha1.CStorVolumeSpec{ReplicationFactor: tc.rf}
		if got := spec.EffectiveReplicationFactor(); got != tc.want {
			t.Errorf("rf=%d: EffectiveReplicationFactor() = %d, want %d", tc.rf, got, tc.want)
		}
	}
}

// A backup is restored in the namespace it was made in, and in those its store allows; one
// that records no namespace only in those.
func TestMayRestore(t *testing.T) {
	store := func(allowed ...string) *v1alpha1.BackupStore {
		return &v1alpha1.BackupStore{Spec: v1alpha1.BackupStoreSpec{AllowedNamespaces: allowed}}
	}
	for _, tc := range []struct {
		store             *v1alpha1.BackupStore
		origin, namespace string
		want              bool
	}{
		{store(), "a", "a", true},
		{store(), "b", "a", false},
		{store(), "", "a", false},
		{store(), "", "", false},
		{store("a"), "b", "a", true},
		{store("a"), "", "a", true},
		{store("a"), "a", "c", false},
		{store("*"), "b", "c", true},
		{store("*"), "", "c", true},
	} {
		if got := tc.store.MayRestore(tc.origin, tc.namespace); got != tc.want {
			t.Errorf("store allowing %q: a backup of %q restored in %q: %v, want %v", tc.store.Spec.AllowedNamespaces, tc.origin, tc.namespace, got, tc.want)
		}
	}
}
