package simnode_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/internal/simnode"
	"github.com/crdipc/crdipc/internal/testenv"
)

// TestHeartbeat: a served node has a Lease in kube-node-lease, owned by the Node, renewed
// as a kubelet renews it (what the node lifecycle controller reads), and reports capacity
// for kube-scheduler.
func TestHeartbeat(t *testing.T) {
	env := testenv.Get(t)
	c := env.Client
	ctx := context.Background()
	name := "heartbeat"
	if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{simnode.Label: "true"}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}) })
	mgr := testenv.NewManager(t, env.Config)
	if err := simnode.Add(mgr, simnode.Options{}); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "manager", mgr.Start)

	waitNode(t, c, name, "Ready with capacity", func(n *corev1.Node) bool {
		pods := n.Status.Allocatable[corev1.ResourcePods]
		cpu := n.Status.Allocatable[corev1.ResourceCPU]
		mem := n.Status.Allocatable[corev1.ResourceMemory]
		return isReady(n) && pods.Value() == 110 && cpu.Value() > 0 && mem.Value() > 0
	})
	var node corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &node); err != nil {
		t.Fatal(err)
	}
	var first time.Time
	lease := func(what string, ok func(*coordinationv1.Lease) error) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, "lease of "+name+" "+what, func(ctx context.Context) (bool, error) {
			var l coordinationv1.Lease
			if err := c.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: name}, &l); err != nil {
				return false, err
			}
			if err := ok(&l); err != nil {
				return false, err
			}
			return true, nil
		})
	}
	lease("held by the node, owned by it", func(l *coordinationv1.Lease) error {
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != name || l.Spec.RenewTime == nil {
			return fmt.Errorf("spec %+v", l.Spec)
		}
		if len(l.OwnerReferences) != 1 || l.OwnerReferences[0].UID != node.UID {
			return fmt.Errorf("owners %+v", l.OwnerReferences)
		}
		first = l.Spec.RenewTime.Time
		return nil
	})
	lease("renewed", func(l *coordinationv1.Lease) error {
		if !l.Spec.RenewTime.After(first) {
			return fmt.Errorf("renewed at %v, first %v", l.Spec.RenewTime.Time, first)
		}
		return nil
	})
}
