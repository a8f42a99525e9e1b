package testenv

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// LiftNotReadyTaint takes the taint node.kubernetes.io/not-ready off the named Nodes, as
// the node lifecycle controller does once a node is Ready. Admission (TaintNodesByCondition)
// puts it on every new Node, and it keeps kube-scheduler off the node; the tests' control
// plane runs no node lifecycle controller, since their bare Nodes have no kubelet to renew
// a Lease.
func LiftNotReadyTaint(t testing.TB, c client.Client, nodes ...string) {
	t.Helper()
	for _, name := range nodes {
		Eventually(t, 30*time.Second, "node "+name+" without the not-ready taint", func(ctx context.Context) (bool, error) {
			var n corev1.Node
			if err := c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
				return false, err
			}
			base := n.DeepCopy()
			n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeNotReady })
			if len(n.Spec.Taints) == len(base.Spec.Taints) {
				return true, nil
			}
			// A conflict (the node's own writer) is retried with a fresh read.
			return false, c.Patch(ctx, &n, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		})
	}
}
