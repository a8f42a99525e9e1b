package agent

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// SimulatedLabel marks a Node as simulated: `crdipc up` runs its pool agent in-process.
const SimulatedLabel = "storage.crdipc.io/simulated"

// SupervisorOptions configure the simulated nodes of `crdipc up`.
type SupervisorOptions struct {
	// Nodes is how many simulated nodes (node-1 … node-N) to create at start if they do
	// not exist yet. Nodes that exist already, from an earlier run or from kubectl, are
	// served as well.
	Nodes int
	// Root holds each node's agent root, Root/<node>.
	Root string
	// Agent is the template for every agent; Node, Root, Identity and DataAddr are set
	// per node.
	Agent Options
	// NoData runs the agents without their replica data services.
	NoData bool
}

// dataIP is the loopback address of the i-th simulated node's replica data service (i ≥ 1):
// 127.1.x.y, apart from the pods' 127.2.0.0/16, so each node is a host of its own on the
// data path as on a real network. The port is chosen by the kernel, so several `crdipc up`
// and test processes never collide; the replicas report it.
func dataIP(i int) string { return fmt.Sprintf("127.1.%d.%d", i/254, i%254+1) }

// Supervisor runs one agent per simulated Node: it starts an agent when a Node labelled
// storage.crdipc.io/simulated=true appears, and when the Node is deleted it stops the agent
// and marks the node's pools and replicas Offline. With no kubelet, it also plays the
// kubelet's part of reporting the Node Ready.
type Supervisor struct {
	cfg *rest.Config
	c   client.Client
	o   SupervisorOptions
	log logr.Logger

	// Agents run until ctx ends: when the manager stops, after Start has stopped them.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	agents  map[string]*runningAgent
	stopped bool
	// dataIPs are the nodes' data addresses, kept for the process's life so a node that
	// comes back gets its address back.
	dataIPs map[string]string
}

type runningAgent struct {
	agent  *Agent
	cancel context.CancelFunc
	done   chan struct{}
}

// AddSupervisor adds a Supervisor to mgr: a Node controller plus a runnable that creates
// the initial nodes and, when mgr stops, stops every agent.
func AddSupervisor(mgr manager.Manager, cfg *rest.Config, o SupervisorOptions) (*Supervisor, error) {
	if o.Root == "" {
		return nil, fmt.Errorf("simulated nodes: a root directory is required")
	}
	s := &Supervisor{cfg: cfg, c: mgr.GetClient(), o: o, log: mgr.GetLogger().WithName("simulated-nodes"), agents: map[string]*runningAgent{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if err := mgr.Add(s); err != nil {
		return nil, err
	}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("simulated-nodes").
		For(&corev1.Node{}, builder.WithPredicates(simulated)).
		Complete(s)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (s *Supervisor) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable.
func (s *Supervisor) Start(ctx context.Context) error {
	for i := 1; i <= s.o.Nodes; i++ {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name:   fmt.Sprintf("node-%d", i),
			Labels: map[string]string{SimulatedLabel: "true", corev1.LabelHostname: fmt.Sprintf("node-%d", i)},
		}}
		node.Status.Conditions = []corev1.NodeCondition{readyCondition(corev1.ConditionTrue, "simulated node created by crdipc up")}
		if err := s.c.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
			s.stopAll()
			return fmt.Errorf("creating simulated node %s: %w", node.Name, err)
		}
	}
	<-ctx.Done()
	nodes := s.stopAll()
	// Nothing serves these nodes any more: say so, as a node controller would.
	stopCtx, stop := context.WithTimeout(context.Background(), 2*time.Second)
	defer stop()
	for _, name := range nodes {
		_ = s.setNodeReady(stopCtx, name, corev1.ConditionUnknown, "crdipc up stopped; no pool agent runs for this node")
	}
	return nil
}

// stopAll stops every agent, for good, and returns their nodes.
func (s *Supervisor) stopAll() []string {
	s.mu.Lock()
	s.stopped = true
	agents := s.agents
	s.agents = map[string]*runningAgent{}
	s.mu.Unlock()
	s.cancel()
	nodes := make([]string, 0, len(agents))
	for name, a := range agents {
		<-a.done
		nodes = append(nodes, name)
	}
	return nodes
}

// Reconcile implements reconcile.Reconciler for Nodes.
func (s *Supervisor) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	err := s.c.Get(ctx, req.NamespacedName, &node)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if err == nil && isSimulated(&node) && node.DeletionTimestamp.IsZero() {
		if err := s.startAgent(node.Name); err != nil {
			return reconcile.Result{}, err
		}
		c := nodeReady(&node)
		if c == nil || c.Status != corev1.ConditionTrue {
			if err := s.setNodeReady(ctx, node.Name, corev1.ConditionTrue, "pool agent running in crdipc up"); err != nil {
				return reconcile.Result{}, err
			}
		}
		return reconcile.Result{}, nil
	}
	s.stopAgent(req.Name)
	if err == nil && node.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil // no longer simulated: someone else serves it now
	}
	return reconcile.Result{}, s.markOffline(ctx, req.Name)
}

// simulated passes events of simulated Nodes, including a Node losing the label.
var simulated = predicate.Funcs{
	CreateFunc:  func(e event.CreateEvent) bool { return isSimulated(e.Object) },
	UpdateFunc:  func(e event.UpdateEvent) bool { return isSimulated(e.ObjectOld) || isSimulated(e.ObjectNew) },
	DeleteFunc:  func(e event.DeleteEvent) bool { return isSimulated(e.Object) },
	GenericFunc: func(e event.GenericEvent) bool { return isSimulated(e.Object) },
}

func isSimulated(o client.Object) bool { return o.GetLabels()[SimulatedLabel] == "true" }

// Running reports whether an agent runs for node.
func (s *Supervisor) Running(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.agents[node]
	return ok
}

func (s *Supervisor) startAgent(node string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.agents[node]; ok || s.stopped {
		return nil
	}
	o := s.o.Agent
	o.Node = node
	o.Root = filepath.Join(s.o.Root, node)
	if !s.o.NoData {
		if s.dataIPs == nil {
			s.dataIPs = map[string]string{}
		}
		if s.dataIPs[node] == "" {
			s.dataIPs[node] = dataIP(len(s.dataIPs))
		}
		o.DataAddr = net.JoinHostPort(s.dataIPs[node], "0")
	}
	// One process holds the data directory, so a fixed identity is safe, and after a
	// crash the agent takes its node's Lease back at once instead of waiting for it to
	// expire.
	o.Identity = "crdipc-up/" + node
	a, err := New(s.cfg, o)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(s.ctx)
	ra := &runningAgent{agent: a, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(ra.done)
		if err := a.Run(ctx); err != nil {
			s.log.Error(err, "pool agent failed", "node", node)
		}
	}()
	s.agents[node] = ra
	s.log.Info("started pool agent", "node", node, "root", o.Root)
	return nil
}

// stopAgent stops node's agent, if one runs.
func (s *Supervisor) stopAgent(node string) {
	s.mu.Lock()
	a, ok := s.agents[node]
	delete(s.agents, node)
	s.mu.Unlock()
	if ok {
		a.cancel()
		<-a.done
		s.log.Info("stopped pool agent", "node", node)
	}
}

// markOffline reports a deleted node's pools and replicas Offline: nothing serves them.
func (s *Supervisor) markOffline(ctx context.Context, node string) error {
	msg := fmt.Sprintf("node %s was deleted; its pool agent is stopped", node)
	var pools storagev1alpha1.CStorPoolList
	if err := s.c.List(ctx, &pools); err != nil {
		return err
	}
	for i := range pools.Items {
		p := &pools.Items[i]
		if p.Spec.NodeName != node || p.Status.Phase == storagev1alpha1.PoolPhaseOffline {
			continue
		}
		p.Status.Phase = storagev1alpha1.PoolPhaseOffline
		meta.SetStatusCondition(&p.Status.Conditions, offlineCondition(p.Generation, msg))
		if err := s.c.Status().Update(ctx, p); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	var replicas storagev1alpha1.CStorVolumeReplicaList
	if err := s.c.List(ctx, &replicas); err != nil {
		return err
	}
	for i := range replicas.Items {
		r := &replicas.Items[i]
		if r.Spec.NodeName != node || r.Status.Phase != storagev1alpha1.ReplicaPhaseHealthy {
			continue
		}
		r.Status.Phase = storagev1alpha1.ReplicaPhaseOffline
		meta.SetStatusCondition(&r.Status.Conditions, offlineCondition(r.Generation, msg))
		if err := s.c.Status().Update(ctx, r); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

func offlineCondition(gen int64, msg string) metav1.Condition {
	return metav1.Condition{Type: conditions.TypeReady, Status: metav1.ConditionFalse, Reason: conditions.ReasonDegraded, Message: msg, ObservedGeneration: gen}
}

func (s *Supervisor) setNodeReady(ctx context.Context, name string, status corev1.ConditionStatus, msg string) error {
	var node corev1.Node
	if err := s.c.Get(ctx, client.ObjectKey{Name: name}, &node); err != nil {
		return client.IgnoreNotFound(err)
	}
	c := readyCondition(status, msg)
	found := false
	for i := range node.Status.Conditions {
		if node.Status.Conditions[i].Type == corev1.NodeReady {
			node.Status.Conditions[i] = c
			found = true
		}
	}
	if !found {
		node.Status.Conditions = append(node.Status.Conditions, c)
	}
	if err := s.c.Status().Update(ctx, &node); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("updating node %s status: %w", name, err)
	}
	return nil
}

func readyCondition(status corev1.ConditionStatus, msg string) corev1.NodeCondition {
	now := metav1.Now()
	reason := "SimulatedNodeReady"
	if status != corev1.ConditionTrue {
		reason = "SimulatedNodeStopped"
	}
	return corev1.NodeCondition{Type: corev1.NodeReady, Status: status, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
}

func nodeReady(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}
