package agent

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/simnode"
)

// SupervisorOptions configure the pool agents of the simulated nodes of `crdipc up`.
type SupervisorOptions struct {
	// Root holds each node's agent root, Root/<node>.
	Root string
	// Agent is the template for every agent; Node, Root, Identity and DataAddr are set
	// per node, and LocalSocket is each node's default (LocalSocket(Root/<node>)) unless
	// the template says "none".
	Agent Options
	// NoData runs the agents without their replica data services.
	NoData bool
	// Config, when set, gives each node's agent its own client config: a token bound to
	// the node, which the pool agents' node restriction requires. Default: the
	// Supervisor's config.
	Config func(node string) (*rest.Config, error)
}

// dataIP is the loopback address of the i-th simulated node's replica data service (i ≥ 1):
// 127.1.x.y, apart from the pods' 127.2.0.0/16, so each node is a host of its own on the
// data path as on a real network. The port is chosen by the kernel, so several `crdipc up`
// and test processes never collide; the replicas report it.
func dataIP(i int) string { return fmt.Sprintf("127.1.%d.%d", i/254, i%254+1) }

// Supervisor runs one agent per simulated Node (package simnode): it starts an agent when a
// simulated Node appears, and when the Node is deleted it stops the agent and marks the
// node's pools and replicas Offline. Reporting the Nodes Ready is simnode's part.
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

// AddSupervisor adds a Supervisor to mgr: a Node controller plus a runnable that, when mgr
// stops, stops every agent. The Nodes themselves come from simnode.Add.
func AddSupervisor(mgr manager.Manager, cfg *rest.Config, o SupervisorOptions) (*Supervisor, error) {
	if o.Root == "" {
		return nil, fmt.Errorf("simulated nodes' pool agents: a root directory is required")
	}
	s := &Supervisor{cfg: cfg, c: mgr.GetClient(), o: o, log: mgr.GetLogger().WithName("simulated-node-agents"), agents: map[string]*runningAgent{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if err := mgr.Add(s); err != nil {
		return nil, err
	}
	err := ctrl.NewControllerManagedBy(mgr).
		Named("simulated-node-agents").
		For(&corev1.Node{}, builder.WithPredicates(simnode.Predicate())).
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
	<-ctx.Done()
	s.stopAll()
	return nil
}

// stopAll stops every agent, for good.
func (s *Supervisor) stopAll() {
	s.mu.Lock()
	s.stopped = true
	agents := s.agents
	s.agents = map[string]*runningAgent{}
	s.mu.Unlock()
	s.cancel()
	for _, a := range agents {
		<-a.done
	}
}

// Reconcile implements reconcile.Reconciler for Nodes.
func (s *Supervisor) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	err := s.c.Get(ctx, req.NamespacedName, &node)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if err == nil && simnode.IsSimulated(&node) && node.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, s.startAgent(node.Name)
	}
	s.stopAgent(req.Name)
	if err == nil && node.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil // no longer simulated: someone else serves it now
	}
	return reconcile.Result{}, s.markOffline(ctx, req.Name)
}

// Running reports whether an agent runs for node.
func (s *Supervisor) Running(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.agents[node]
	return ok
}

// Leading reports whether node's agent runs and holds the node's Lease.
func (s *Supervisor) Leading(node string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.agents[node]
	return ok && a.agent.Leading()
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
	if o.LocalSocket != "none" {
		o.LocalSocket = "" // each node's own, under its root
	}
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
	cfg := s.cfg
	if s.o.Config != nil {
		var err error
		if cfg, err = s.o.Config(node); err != nil {
			return err
		}
	}
	a, err := New(cfg, o)
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
