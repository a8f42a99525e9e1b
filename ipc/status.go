package ipc

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
)

// Status is the part of an object that the status contract defines.
type Status struct {
	Generation         int64
	ObservedGeneration int64
	Conditions         []metav1.Condition
}

// StatusOf reads the contract fields of any object: crdipc's typed kinds
// directly, anything else (unstructured, other teams' kinds following the
// same contract) through its JSON shape.
func StatusOf(obj client.Object) (Status, error) {
	if o, ok := obj.(conditions.Object); ok {
		return Status{Generation: obj.GetGeneration(), ObservedGeneration: o.GetObservedGeneration(), Conditions: o.GetConditions()}, nil
	}
	var u map[string]any
	if un, ok := obj.(*unstructured.Unstructured); ok {
		u = un.Object
	} else {
		var err error
		if u, err = runtime.DefaultUnstructuredConverter.ToUnstructured(obj); err != nil {
			return Status{}, fmt.Errorf("reading status of %T: %w", obj, err)
		}
	}
	s := Status{Generation: obj.GetGeneration()}
	s.ObservedGeneration, _, _ = unstructured.NestedInt64(u, "status", "observedGeneration")
	raw, found, err := unstructured.NestedSlice(u, "status", "conditions")
	if err != nil || !found {
		return s, nil
	}
	for _, item := range raw {
		m, ok := item.(map[string]any)
		if !ok {
			continue
		}
		var c metav1.Condition
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &c); err != nil {
			return Status{}, fmt.Errorf("reading status.conditions: %w", err)
		}
		s.Conditions = append(s.Conditions, c)
	}
	return s, nil
}

// Current reports whether the status was written for the object's current
// generation. Only a current status says anything about the current spec.
func (s Status) Current() bool {
	return s.Generation > 0 && s.ObservedGeneration >= s.Generation
}

// Condition returns the condition of type t if it was written for the
// current generation. A condition carrying an older observedGeneration is
// treated as absent.
func (s Status) Condition(t string) *metav1.Condition {
	c := meta.FindStatusCondition(s.Conditions, t)
	if c == nil || (c.ObservedGeneration != 0 && c.ObservedGeneration < s.Generation) {
		return nil
	}
	return c
}
