package simnode

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Label marks a Node as simulated (value "true"): this process stands in for its kubelet.
const Label = "crdipc.io/simulated"

// legacyLabel is Label's name before it moved out of storage; Nodes still carrying it are
// relabelled so that data directories of earlier versions keep their nodes.
const legacyLabel = "storage.crdipc.io/simulated"

// Options configure the simulated nodes.
type Options struct {
	// Nodes is how many simulated nodes (node-1 … node-N) to create at start if they do not
	// exist yet. Nodes that exist already, from an earlier run or from kubectl, are served
	// as well.
	Nodes int
	// Kubelet, when set, returns the client that acts for one node, as its kubelet does:
	// with the node's own credentials (system:node:<name>), so that the Node authorizer
	// and NodeRestriction admission let it register and report only its own Node and renew
	// only its own Lease. Without it, every node acts with the manager's credentials.
	Kubelet func(node string) (client.Client, error)
}

// NodeName is the name of the i-th simulated node created at start (i ≥ 1).
func NodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// IsSimulated reports whether o, a Node, is a simulated node.
func IsSimulated(o client.Object) bool { return o.GetLabels()[Label] == "true" }

// Predicate passes the events of simulated Nodes, including a Node losing the label, for
// controllers that serve simulated nodes.
func Predicate() predicate.Predicate { return labelled(IsSimulated) }

// labelled passes the events of Nodes for which is holds, before or after an update.
func labelled(is func(client.Object) bool) predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return is(e.Object) },
		UpdateFunc:  func(e event.UpdateEvent) bool { return is(e.ObjectOld) || is(e.ObjectNew) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return is(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return is(e.Object) },
	}
}

// servedOrLegacy is what this package's own controller watches: simulated Nodes and those
// still carrying the legacy label, which it relabels.
func servedOrLegacy(o client.Object) bool {
	_, legacy := o.GetLabels()[legacyLabel]
	return legacy || IsSimulated(o)
}

// nodes reports simulated Nodes Ready. It is both a Node controller and a runnable: the
// runnable creates the initial Nodes and, when the manager stops, reports Unknown.
type nodes struct {
	c   client.Client // the manager's: it watches the simulated Nodes
	o   Options
	log logr.Logger

	// stopMu guards stopped. A reconcile reports Ready under the read lock, so no Ready=True
	// lands after the Unknown written at stop.
	stopMu  sync.RWMutex
	stopped bool

	mu sync.Mutex
	// served are the Nodes reported Ready, to be reported Unknown at stop.
	served map[string]bool
}

// Add adds the simulated nodes to mgr: a runnable that creates node-1 … node-N and a Node
// controller that reports simulated Nodes Ready. Both need leader election, as two
// processes serving one node would contradict each other.
func Add(mgr manager.Manager, o Options) error {
	if o.Nodes < 0 {
		return fmt.Errorf("simulated nodes: %d nodes: must not be negative", o.Nodes)
	}
	if o.Kubelet == nil {
		// Uncached, as a kubelet's own client is: the Ready=Unknown at stop reads the Node
		// after the manager's cache has stopped.
		c, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
		if err != nil {
			return fmt.Errorf("simulated nodes: %w", err)
		}
		o.Kubelet = func(string) (client.Client, error) { return c, nil }
	}
	n := &nodes{c: mgr.GetClient(), o: o, log: mgr.GetLogger().WithName("simulated-nodes"), served: map[string]bool{}}
	if err := mgr.Add(n); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("simulated-nodes").
		For(&corev1.Node{}, builder.WithPredicates(labelled(servedOrLegacy))).
		Complete(n)
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (n *nodes) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable.
func (n *nodes) Start(ctx context.Context) error {
	for i := 1; i <= n.o.Nodes; i++ {
		name := NodeName(i)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: map[string]string{Label: "true", corev1.LabelHostname: name},
		}}
		// A Node's status may be set on create: it is Ready from its first event.
		node.Status.Conditions = []corev1.NodeCondition{readyCondition(corev1.ConditionTrue, "simulated node created by crdipc up")}
		// The node registers itself, as a kubelet does: a node may create its own Node.
		c, err := n.o.Kubelet(name)
		if err != nil {
			return fmt.Errorf("simulated node %s: %w", name, err)
		}
		if err := c.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating simulated node %s: %w", name, err)
		}
	}
	n.heartbeat(ctx)
	n.stopMu.Lock()
	n.stopped = true
	n.stopMu.Unlock()
	n.mu.Lock()
	served := n.served
	n.served = map[string]bool{}
	n.mu.Unlock()
	// Nothing serves these nodes any more: say so, as a node controller would.
	stopCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for name := range served {
		if err := n.setReady(stopCtx, name, corev1.ConditionUnknown, "crdipc up stopped; nothing serves this simulated node"); err != nil {
			n.log.Error(err, "reporting node Unknown", "node", name)
		}
	}
	return nil
}

// Reconcile implements reconcile.Reconciler for Nodes.
func (n *nodes) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	if err := n.c.Get(ctx, req.NamespacedName, &node); err != nil {
		if apierrors.IsNotFound(err) {
			n.forget(req.Name)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if _, ok := node.Labels[legacyLabel]; ok {
		// The update event of the relabelled Node brings it back here.
		return reconcile.Result{}, n.relabel(ctx, &node)
	}
	if !IsSimulated(&node) || !node.DeletionTimestamp.IsZero() {
		n.forget(node.Name) // no longer simulated: someone else reports it now
		return reconcile.Result{}, nil
	}
	n.stopMu.RLock()
	defer n.stopMu.RUnlock()
	if n.stopped {
		return reconcile.Result{}, nil
	}
	n.mu.Lock()
	n.served[node.Name] = true
	n.mu.Unlock()
	if err := n.renew(ctx, &node); err != nil {
		return reconcile.Result{}, err
	}
	if c := nodeReady(&node); c != nil && c.Status == corev1.ConditionTrue && hasCapacity(&node) {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{}, n.setReady(ctx, node.Name, corev1.ConditionTrue, "simulated node served by crdipc up")
}

func (n *nodes) forget(name string) {
	n.mu.Lock()
	delete(n.served, name)
	n.mu.Unlock()
}

// relabel moves node from the legacy label to Label, keeping the value; a Label already
// there wins.
func (n *nodes) relabel(ctx context.Context, node *corev1.Node) error {
	c, err := n.o.Kubelet(node.Name)
	if err != nil {
		return fmt.Errorf("relabelling node %s: %w", node.Name, err)
	}
	base := node.DeepCopy()
	if _, ok := node.Labels[Label]; !ok {
		node.Labels[Label] = node.Labels[legacyLabel]
	}
	delete(node.Labels, legacyLabel)
	// Neither label is one NodeRestriction keeps from a node: the node relabels itself.
	if err := c.Patch(ctx, node, client.MergeFrom(base)); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("relabelling node %s %s → %s: %w", node.Name, legacyLabel, Label, err))
	}
	n.log.Info("relabelled simulated node", "node", node.Name, "from", legacyLabel, "to", Label)
	return nil
}

// setReady sets node name's Ready condition, as the node. It reads the Node from the API
// server, not the cache, which may already be stopped when it runs at stop.
func (n *nodes) setReady(ctx context.Context, name string, status corev1.ConditionStatus, msg string) error {
	kc, err := n.o.Kubelet(name)
	if err != nil {
		return fmt.Errorf("updating node %s status: %w", name, err)
	}
	var node corev1.Node
	if err := kc.Get(ctx, client.ObjectKey{Name: name}, &node); err != nil {
		return client.IgnoreNotFound(err)
	}
	c := readyCondition(status, msg)
	if status == corev1.ConditionTrue {
		// What kube-scheduler fits pods against: the machine the pods' processes share.
		node.Status.Capacity, node.Status.Allocatable = capacity().DeepCopy(), capacity().DeepCopy()
	}
	if old := nodeReady(&node); old != nil {
		if old.Status == status {
			c.LastTransitionTime = old.LastTransitionTime
		}
		*old = c
	} else {
		node.Status.Conditions = append(node.Status.Conditions, c)
	}
	if err := kc.Status().Update(ctx, &node); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("updating node %s status: %w", name, err)
	}
	return nil
}

// readyCondition is a simulated node's Ready condition, as a kubelet would post it.
func readyCondition(status corev1.ConditionStatus, msg string) corev1.NodeCondition {
	now := metav1.Now()
	reason := "SimulatedNodeReady"
	if status != corev1.ConditionTrue {
		reason = "SimulatedNodeStopped"
	}
	return corev1.NodeCondition{Type: corev1.NodeReady, Status: status, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
}

// nodeReady returns n's Ready condition, or nil.
func nodeReady(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}
