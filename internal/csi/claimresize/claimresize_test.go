package claimresize_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crdipc/crdipc/internal/csi/claimresize"
)

func TestMergeConditions(t *testing.T) {
	then := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	old := []corev1.PersistentVolumeClaimCondition{
		{Type: "Unused", Status: corev1.ConditionFalse, LastTransitionTime: then},
		{Type: corev1.PersistentVolumeClaimResizing, Status: corev1.ConditionTrue, LastTransitionTime: then},
		{Type: corev1.PersistentVolumeClaimNodeResizeError, Status: corev1.ConditionTrue, LastTransitionTime: then},
	}
	got := claimresize.MergeConditions(old,
		corev1.PersistentVolumeClaimCondition{Type: corev1.PersistentVolumeClaimResizing, Status: corev1.ConditionTrue},
		corev1.PersistentVolumeClaimCondition{Type: corev1.PersistentVolumeClaimFileSystemResizePending, Status: corev1.ConditionTrue})
	if len(got) != 3 || got[0].Type != "Unused" || got[1].Type != corev1.PersistentVolumeClaimResizing || got[2].Type != corev1.PersistentVolumeClaimFileSystemResizePending {
		t.Fatalf("merged: %+v; want Unused kept, NodeResizeError gone, Resizing and FileSystemResizePending", got)
	}
	if !got[1].LastTransitionTime.Equal(&then) {
		t.Errorf("Resizing, unchanged, moved to %v", got[1].LastTransitionTime)
	}
	if got[2].LastTransitionTime.Equal(&then) || got[2].LastTransitionTime.IsZero() {
		t.Errorf("FileSystemResizePending, new, at %v; want now", got[2].LastTransitionTime)
	}
	if none := claimresize.MergeConditions(old); len(none) != 1 || none[0].Type != "Unused" {
		t.Errorf("merging nothing: %+v, want only Unused", none)
	}
}

func TestSetStatus(t *testing.T) {
	var s corev1.PersistentVolumeClaimStatus
	claimresize.SetStatus(&s, corev1.PersistentVolumeClaimNodeResizePending)
	if s.AllocatedResourceStatuses[corev1.ResourceStorage] != corev1.PersistentVolumeClaimNodeResizePending {
		t.Fatalf("after set: %v", s.AllocatedResourceStatuses)
	}
	claimresize.SetStatus(&s, "")
	if s.AllocatedResourceStatuses != nil {
		t.Errorf("after clearing: %v, want nil", s.AllocatedResourceStatuses)
	}
}
