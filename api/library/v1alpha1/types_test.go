package v1alpha1_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crdipc/crdipc/api/conditions"
	"github.com/crdipc/crdipc/api/library/v1alpha1"
)

func TestBookDeepCopy(t *testing.T) {
	ttl := int32(30)
	orig := &v1alpha1.Book{
		ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "default", Labels: map[string]string{"a": "1"}},
		Spec:       v1alpha1.BookSpec{Title: "T", Author: "A", ISBN: "0-306-40615-2", TTLSecondsAfterFinished: &ttl},
		Status: v1alpha1.BookStatus{ObservedGeneration: 1, Conditions: []metav1.Condition{
			{Type: conditions.TypeReady, Status: metav1.ConditionTrue, Reason: conditions.ReasonSucceeded},
		}},
	}
	cp, ok := orig.DeepCopyObject().(*v1alpha1.Book)
	if !ok {
		t.Fatalf("DeepCopyObject returned %T", orig.DeepCopyObject())
	}
	if !equality.Semantic.DeepEqual(orig, cp) {
		t.Fatal("copy differs from original")
	}
	// Changing everything reachable through a pointer, map or slice must not reach orig.
	*cp.Spec.TTLSecondsAfterFinished = 0
	cp.Labels["a"] = "2"
	cp.Status.Conditions[0].Reason = conditions.ReasonFailed
	if *orig.Spec.TTLSecondsAfterFinished != 30 || orig.Labels["a"] != "1" ||
		orig.Status.Conditions[0].Reason != conditions.ReasonSucceeded {
		t.Fatal("copy shares memory with original")
	}

	list := &v1alpha1.BookList{Items: []v1alpha1.Book{*orig}}
	lcp := list.DeepCopyObject().(*v1alpha1.BookList)
	lcp.Items[0].Spec.Title = "changed"
	if list.Items[0].Spec.Title != "T" {
		t.Fatal("list copy shares items with original")
	}
}

func TestBookIsConditionsObject(t *testing.T) {
	var o conditions.Object = &v1alpha1.Book{}
	o.SetObservedGeneration(3)
	o.SetConditions([]metav1.Condition{{Type: conditions.TypeReady}})
	if o.GetObservedGeneration() != 3 || len(o.GetConditions()) != 1 {
		t.Fatal("status accessors do not round-trip")
	}
}
