package simnode_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/internal/simnode"
	"github.com/crdipc/crdipc/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The life of the simulated nodes of `crdipc up --nodes 2` on a data dir of an earlier
// version: node-1 and node-2 are created Ready, a Node with the old label is relabelled and
// served, a labelled Node added later turns Ready, one set NotReady behind our back turns
// Ready again, an unlabelled Node is left alone, and stopping reports every served Node
// Ready=Unknown.
func TestSimulatedNodes(t *testing.T) {
	env := testenv.Get(t)
	c := env.Client
	ctx := context.Background()
	create := func(name string, labels map[string]string) {
		t.Helper()
		if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}) })
	}
	t.Cleanup(func() {
		for _, n := range []string{simnode.NodeName(1), simnode.NodeName(2)} {
			_ = c.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
		}
	})
	create("old", map[string]string{"storage.crdipc.io/simulated": "true"})
	create("real", map[string]string{"example.com/pool": "a"})

	mgr := testenv.NewManager(t, env.Config)
	if err := simnode.Add(mgr, simnode.Options{Nodes: 2}); err != nil {
		t.Fatal(err)
	}
	stop := testenv.Start(t, "manager", mgr.Start)

	waitNode(t, c, simnode.NodeName(1), "Ready, labelled", func(n *corev1.Node) bool {
		return ready(n) == corev1.ConditionTrue && simnode.IsSimulated(n) && n.Labels[corev1.LabelHostname] == simnode.NodeName(1)
	})
	waitNode(t, c, simnode.NodeName(2), "Ready", isReady)
	waitNode(t, c, "old", "relabelled and Ready", func(n *corev1.Node) bool {
		_, legacy := n.Labels["storage.crdipc.io/simulated"]
		return !legacy && simnode.IsSimulated(n) && ready(n) == corev1.ConditionTrue
	})

	// kubectl apply of a simulated Node: no status, it turns Ready.
	create("added", map[string]string{simnode.Label: "true"})
	waitNode(t, c, "added", "Ready", isReady)

	// Someone reports node-1 NotReady: while the process runs, it is Ready again.
	var n corev1.Node
	if err := c.Get(ctx, client.ObjectKey{Name: simnode.NodeName(1)}, &n); err != nil {
		t.Fatal(err)
	}
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			n.Status.Conditions[i].Status = corev1.ConditionFalse
		}
	}
	if err := c.Status().Update(ctx, &n); err != nil {
		t.Fatal(err)
	}
	waitNode(t, c, simnode.NodeName(1), "Ready again", isReady)

	stop()
	for _, name := range []string{simnode.NodeName(1), simnode.NodeName(2), "old", "added"} {
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			t.Fatal(err)
		}
		if got := ready(&n); got != corev1.ConditionUnknown {
			t.Errorf("node %s after stop: Ready=%q, want Unknown", name, got)
		}
	}
	// Not simulated: nobody reported anything for it.
	if err := c.Get(ctx, client.ObjectKey{Name: "real"}, &n); err != nil {
		t.Fatal(err)
	}
	if got := ready(&n); got != "" || simnode.IsSimulated(&n) {
		t.Errorf("unlabelled node: Ready=%q, labels %v; want it untouched", got, n.Labels)
	}
}

func ready(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}

func isReady(n *corev1.Node) bool { return ready(n) == corev1.ConditionTrue }

func waitNode(t *testing.T, c client.Client, name, what string, ok func(*corev1.Node) bool) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "node "+name+" "+what, func(ctx context.Context) (bool, error) {
		var n corev1.Node
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
			return false, err
		}
		if !ok(&n) {
			return false, fmt.Errorf("labels %v, conditions %+v", n.Labels, n.Status.Conditions)
		}
		return true, nil
	})
}
