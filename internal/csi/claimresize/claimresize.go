// Package claimresize writes a PersistentVolumeClaim's volume expansion status the way
// Kubernetes' resizer and kubelet do with RecoverVolumeExpansionFailure: the resize
// conditions and allocatedResourceStatuses["storage"]. The CSI sidecar's resizer (the
// controller's part) and the simulated kubelet (the node's part) both use it, so that one
// claim reads the same whichever side wrote it last.
package claimresize

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// conditionTypes are the claim conditions of an expansion; every other condition is left
// as it is.
var conditionTypes = map[corev1.PersistentVolumeClaimConditionType]bool{
	corev1.PersistentVolumeClaimResizing:                true,
	corev1.PersistentVolumeClaimFileSystemResizePending: true,
	corev1.PersistentVolumeClaimControllerResizeError:   true,
	corev1.PersistentVolumeClaimNodeResizeError:         true,
}

// IsCondition says whether t is one of an expansion's conditions.
func IsCondition(t corev1.PersistentVolumeClaimConditionType) bool { return conditionTypes[t] }

// MergeConditions replaces the resize conditions of old with set (none: they are removed),
// keeping the transition time of one whose status did not change.
func MergeConditions(old []corev1.PersistentVolumeClaimCondition, set ...corev1.PersistentVolumeClaimCondition) []corev1.PersistentVolumeClaimCondition {
	var out []corev1.PersistentVolumeClaimCondition
	for _, c := range old {
		if !conditionTypes[c.Type] {
			out = append(out, c)
		}
	}
	now := metav1.Now()
	for _, c := range set {
		c.LastTransitionTime = now
		for _, o := range old {
			if o.Type == c.Type && o.Status == c.Status && !o.LastTransitionTime.IsZero() {
				c.LastTransitionTime = o.LastTransitionTime
			}
		}
		out = append(out, c)
	}
	return out
}

// SetStatus sets allocatedResourceStatuses["storage"] to v, or removes it for "".
func SetStatus(s *corev1.PersistentVolumeClaimStatus, v corev1.ClaimResourceStatus) {
	if v == "" {
		delete(s.AllocatedResourceStatuses, corev1.ResourceStorage)
		if len(s.AllocatedResourceStatuses) == 0 {
			s.AllocatedResourceStatuses = nil
		}
		return
	}
	if s.AllocatedResourceStatuses == nil {
		s.AllocatedResourceStatuses = map[corev1.ResourceName]corev1.ClaimResourceStatus{}
	}
	s.AllocatedResourceStatuses[corev1.ResourceStorage] = v
}
