package simnode_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/internal/simnode"
	"github.com/crdipc/crdipc/internal/testenv"
)

// TestNodesActAsThemselves: as in `crdipc up`, the service watches as its read-only account
// (crdipc-nodes) and each node writes as its own kubelet, system:node:<name>. The nodes
// register themselves, report Ready and renew their Leases that way; and one node's
// credentials open no other node's Node or Lease: the Node authorizer and NodeRestriction
// admission refuse them, as for a real kubelet.
func TestNodesActAsThemselves(t *testing.T) {
	env := testenv.Get(t)
	c := env.Client
	ctx := context.Background()
	names := []string{simnode.NodeName(1), simnode.NodeName(2)}
	t.Cleanup(func() {
		for _, n := range names {
			_ = c.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
		}
	})
	// Made here: AsNode may fail the test, which only the test's goroutine may do.
	kubelets := map[string]client.Client{}
	for _, n := range names {
		kc, err := client.New(env.AsNode(t, n), client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		kubelets[n] = kc
	}
	kubelet := func(node string) (client.Client, error) {
		if kc, ok := kubelets[node]; ok {
			return kc, nil
		}
		return nil, fmt.Errorf("no credentials for node %s in this test", node)
	}

	mgr := testenv.NewManager(t, env.AsServiceAccount(t, "nodes"))
	if err := simnode.Add(mgr, simnode.Options{Nodes: 2, Kubelet: kubelet}); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "manager", mgr.Start)
	for _, n := range names {
		waitNode(t, c, n, "registered and Ready", isReady)
		testenv.Eventually(t, 30*time.Second, "lease of "+n, func(ctx context.Context) (bool, error) {
			var l coordinationv1.Lease
			err := c.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: n}, &l)
			return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == n, err
		})
	}

	one, two := kubelets[names[0]], names[1]
	// Its own Node and Lease: allowed.
	var own corev1.Node
	if err := one.Get(ctx, client.ObjectKey{Name: names[0]}, &own); err != nil {
		t.Fatalf("node-1 reading its own Node: %v", err)
	}
	base := own.DeepCopy()
	own.Labels["simnode.test/own"] = "yes"
	if err := one.Patch(ctx, &own, client.MergeFrom(base)); err != nil {
		t.Errorf("node-1 labelling its own Node: %v", err)
	}
	var ownLease coordinationv1.Lease
	if err := one.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: names[0]}, &ownLease); err != nil {
		t.Fatalf("node-1 reading its own Lease: %v", err)
	}
	now := metav1.NewMicroTime(time.Now())
	ownLease.Spec.RenewTime = &now
	if err := one.Update(ctx, &ownLease); err != nil && !apierrors.IsConflict(err) {
		t.Errorf("node-1 renewing its own Lease: %v", err)
	}

	// Another node's: refused. The objects come from the admin: node-1 may not even read them.
	var other corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: two}, &other); err != nil {
		t.Fatal(err)
	}
	var otherLease coordinationv1.Lease
	if err := c.Get(ctx, client.ObjectKey{Namespace: corev1.NamespaceNodeLease, Name: two}, &otherLease); err != nil {
		t.Fatal(err)
	}
	forbidden := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("node-1 %s: %v, want Forbidden", what, err)
		}
	}
	forbidden("reading node-2", one.Get(ctx, client.ObjectKey{Name: two}, &corev1.Node{}))
	labelled := other.DeepCopy()
	labelled.Labels["simnode.test/by"] = "node-1"
	forbidden("labelling node-2", one.Patch(ctx, labelled, client.MergeFrom(&other)))
	notReady := other.DeepCopy()
	for i := range notReady.Status.Conditions {
		if notReady.Status.Conditions[i].Type == corev1.NodeReady {
			notReady.Status.Conditions[i].Status = corev1.ConditionFalse
		}
	}
	forbidden("reporting node-2 NotReady", one.Status().Update(ctx, notReady))
	forbidden("deleting node-2", one.Delete(ctx, other.DeepCopy()))
	forbidden("registering another node", one.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "simnode-impostor"}}))
	forbidden("reading node-2's Lease", one.Get(ctx, client.ObjectKeyFromObject(&otherLease), &coordinationv1.Lease{}))
	taken := otherLease.DeepCopy()
	taken.Spec.HolderIdentity = &names[0]
	forbidden("taking node-2's Lease", one.Update(ctx, taken))
	forbidden("deleting node-2's Lease", one.Delete(ctx, otherLease.DeepCopy()))
}
