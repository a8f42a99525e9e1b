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
		Spec:       v1alpha1.BitcoinNetworkSpec{Nodes: 2, Image: v1alpha1.BitcoindImage, Network: v1alpha1.NetworkRegtest},
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

// An unset image is the implementation's; a set one is kept whatever the implementation.
func TestImageOrDefault(t *testing.T) {
	for _, tc := range []struct {
		spec v1alpha1.BitcoinNetworkSpec
		want string
	}{
		{v1alpha1.BitcoinNetworkSpec{}, v1alpha1.BitcoindImage},
		{v1alpha1.BitcoinNetworkSpec{Implementation: v1alpha1.ImplementationBitcoind}, v1alpha1.BitcoindImage},
		{v1alpha1.BitcoinNetworkSpec{Implementation: v1alpha1.ImplementationBtcd}, v1alpha1.BtcdImage},
		{v1alpha1.BitcoinNetworkSpec{Implementation: v1alpha1.ImplementationBtcd, Image: "registry.local/btcd:1"}, "registry.local/btcd:1"},
	} {
		if got := tc.spec.ImageOrDefault(); got != tc.want {
			t.Errorf("%+v: image %q, want %q", tc.spec, got, tc.want)
		}
	}
}
