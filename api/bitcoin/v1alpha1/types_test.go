package v1alpha1_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
	"github.com/crdipc/crdipc/api/conditions"
)

func TestDeepCopy(t *testing.T) {
	orig := &v1alpha1.BitcoinNetwork{
		ObjectMeta: metav1.ObjectMeta{Name: "regtest", Namespace: "default"},
		Spec:       v1alpha1.BitcoinNetworkSpec{Nodes: 2, Image: v1alpha1.DefaultImage, Network: v1alpha1.NetworkRegtest},
		Status: v1alpha1.BitcoinNetworkStatus{
			ReadyNodes: 1, Peers: 0,
			Nodes:      []v1alpha1.BitcoinNodeStatus{{Name: "regtest-0", IP: "10.0.0.1", Ready: true}},
			Conditions: []metav1.Condition{{Type: conditions.TypeReady, Reason: conditions.ReasonWaiting}},
		},
	}
	cp := orig.DeepCopyObject().(*v1alpha1.BitcoinNetwork)
	if !equality.Semantic.DeepEqual(orig, cp) {
		t.Fatal("copy differs from original")
	}
	cp.Status.Nodes[0].Ready = false
	cp.Status.Conditions[0].Reason = conditions.ReasonSucceeded
	if !orig.Status.Nodes[0].Ready || orig.Status.Conditions[0].Reason != conditions.ReasonWaiting {
		t.Fatal("copy shares memory with original")
	}
	var _ conditions.Object = orig
}
