package v1alpha1_test

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
	"github.com/crdipc/crdipc/api/conditions"
)

func TestSchemeRegistersKinds(t *testing.T) {
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	for kind, obj := range map[string]runtime.Object{
		"BitcoinNetwork": &v1alpha1.BitcoinNetwork{}, "BitcoinNetworkList": &v1alpha1.BitcoinNetworkList{},
	} {
		gvk := v1alpha1.GroupVersion.WithKind(kind)
		gvks, _, err := s.ObjectKinds(obj)
		if err != nil || len(gvks) != 1 || gvks[0] != gvk {
			t.Errorf("ObjectKinds(%T) = %v, %v; want [%v]", obj, gvks, err, gvk)
		}
		got, err := s.New(gvk)
		if err != nil || reflect.TypeOf(got) != reflect.TypeOf(obj) {
			t.Errorf("New(%v) = %T, %v; want %T", gvk, got, err, obj)
		}
	}
}

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
