package v1alpha1_test

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crdipc/crdipc/api/conditions"
	"github.com/crdipc/crdipc/api/scm/v1alpha1"
)

func TestDeepCopy(t *testing.T) {
	updated := metav1.NewTime(time.Date(2019, 9, 19, 23, 23, 12, 0, time.UTC))
	pr := &v1alpha1.PullRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "hello-world-4", Namespace: "default"},
		Spec: v1alpha1.PullRequestSpec{
			User: "tnishida1", Branch: "feature-x", Status: v1alpha1.PullRequestOpen, ID: 4,
			Repository: "octocat/hello-world", Number: 4, UpdatedAt: &updated,
		},
		Status: v1alpha1.PullRequestStatus{Conditions: []metav1.Condition{{Type: conditions.TypeReady}}},
	}
	prCopy := pr.DeepCopyObject().(*v1alpha1.PullRequest)
	if !equality.Semantic.DeepEqual(pr, prCopy) {
		t.Fatal("PullRequest copy differs from original")
	}
	prCopy.Spec.UpdatedAt.Time = prCopy.Spec.UpdatedAt.Add(time.Hour)
	prCopy.Status.Conditions[0].Type = "Other"
	if !pr.Spec.UpdatedAt.Equal(&updated) || pr.Status.Conditions[0].Type != conditions.TypeReady {
		t.Fatal("PullRequest copy shares memory with original")
	}

	br := &v1alpha1.Branch{
		ObjectMeta: metav1.ObjectMeta{Name: "hello-world-feature-x", Namespace: "default"},
		Spec: v1alpha1.BranchSpec{
			Name: "feature-x", State: v1alpha1.BranchCreated, Repository: "octocat/hello-world", UpdatedAt: &updated,
		},
	}
	brCopy := br.DeepCopyObject().(*v1alpha1.Branch)
	if !equality.Semantic.DeepEqual(br, brCopy) {
		t.Fatal("Branch copy differs from original")
	}
	brCopy.Spec.UpdatedAt.Time = brCopy.Spec.UpdatedAt.Add(time.Hour)
	if !br.Spec.UpdatedAt.Equal(&updated) {
		t.Fatal("Branch copy shares updatedAt with original")
	}

	for _, o := range []conditions.Object{pr, br} {
		o.SetObservedGeneration(2)
		if o.GetObservedGeneration() != 2 {
			t.Fatalf("%T: observedGeneration does not round-trip", o)
		}
	}
}
