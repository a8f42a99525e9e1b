package podsim

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// hostIP is every simulated node's address: pods reach "the node" on loopback.
const hostIP = "127.0.0.1"

// runtime is the kubelet of every simulated node: one controller for all their pods.
// It runs with one worker; background goroutines (process waiters, probers,
// forwarders) only record what happened under mu and enqueue the pod.
type runtime struct {
	c      client.Client // the manager's: it watches the pods and Nodes
	reader client.Reader // the API server itself, as the manager: fresh pods
	cache  cache.Cache
	env    envResolver
	o      Options
	images map[string]Image // by repository()
	names  []string         // configured image names, for messages
	nodes  labels.Selector
	log    logr.Logger

	mu sync.Mutex
	// pods is the pod table: every pod this runtime runs, with its processes, by UID;
	// entries come with ensure and go with forgetUID (podtable.go).
	pods  map[types.UID]*podState
	ips   *ipAllocator
	queue workqueue.TypedRateLimitingInterface[reconcile.Request]
	// claimQueue is the volume expander's (resize.go).
	claimQueue workqueue.TypedRateLimitingInterface[reconcile.Request]
	stopping   bool
	launch     *launcher
	// wg counts every goroutine the runtime starts; Add only under mu while !stopping,
	// or from a goroutine wg already counts.
	wg sync.WaitGroup
	// hostDirs are the mount point directories the runtime created on the node, with the
	// pods that mount there (see useHostDirs).
	hostDirs map[string]map[types.UID]bool
	// expandInUse are the volumes (node/handle) whose NodeExpandVolume answered
	// FailedPrecondition, "not while in use": as kubelet, not tried again until the
	// volume is staged anew on the node (resize.go).
	expandInUse map[string]bool

	// volOps serialises the setup and teardown of volumes, so that a volume is never
	// unstaged from a node while another pod's setup stages it there.
	volOps sync.Mutex
	// volCtx ends when the runtime stops: setups in flight give up, and stopAll unmounts.
	volCtx    context.Context
	volCancel context.CancelFunc
}

func addRuntime(mgr manager.Manager, o Options, nodes labels.Selector, images map[string]Image, names []string) error {
	if o.Kubelet == nil {
		// Uncached: a Secret read must not start an informer on every Secret.
		c, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
		if err != nil {
			return fmt.Errorf("podsim: %w", err)
		}
		k := Kubelet{Client: c, Events: mgr.GetEventRecorder("podsim-kubelet")}
		o.Kubelet = func(string) (Kubelet, error) { return k, nil }
	}
	r := &runtime{
		c:      mgr.GetClient(),
		reader: mgr.GetAPIReader(),
		cache:  mgr.GetCache(),
		o:      o,
		images: images,
		names:  names,
		nodes:  nodes,
		log:    mgr.GetLogger().WithName("podsim-kubelet"),
		pods:   map[types.UID]*podState{},
	}
	r.env = envResolver{as: r.as}
	r.ips = newIPAllocator(r.ipReported)
	r.volCtx, r.volCancel = context.WithCancel(context.Background())
	if err := mgr.Add(r); err != nil {
		return err
	}
	if err := addExpander(mgr, r); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("podsim-kubelet").
		For(&corev1.Pod{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.(*corev1.Pod).Spec.NodeName != ""
		}))).
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.podsOfNode), builder.WithPredicates(selected(nodes))).
		// Process exits and readiness changes come from goroutines: they add to the queue.
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			r.mu.Lock()
			r.queue = q
			r.mu.Unlock()
			return nil
		})).
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Complete(r)
}

// Field indexes on the manager's Pod cache.
const (
	nodeNameIndex = "podsim.spec.nodeName"
	podIPIndex    = "podsim.status.podIP"
)

func addIndexes(mgr manager.Manager) error {
	ctx := context.Background()
	if err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.Pod{}, nodeNameIndex, func(o client.Object) []string {
		return []string{o.(*corev1.Pod).Spec.NodeName}
	}); err != nil {
		return fmt.Errorf("podsim: indexing pods by node: %w", err)
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.Pod{}, podIPIndex, func(o client.Object) []string {
		if ip := o.(*corev1.Pod).Status.PodIP; ip != "" {
			return []string{ip}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("podsim: indexing pods by IP: %w", err)
	}
	return nil
}

// selected passes events of Nodes the selector matches, before or after the change.
func selected(nodes labels.Selector) predicate.Funcs {
	match := func(o client.Object) bool { return nodes.Matches(labels.Set(o.GetLabels())) }
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return match(e.Object) },
		UpdateFunc:  func(e event.UpdateEvent) bool { return match(e.ObjectOld) || match(e.ObjectNew) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return match(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return match(e.Object) },
	}
}

func (r *runtime) podsOfNode(ctx context.Context, node client.Object) []reconcile.Request {
	var pods corev1.PodList
	if err := r.c.List(ctx, &pods, client.MatchingFields{nodeNameIndex: node.GetName()}); err != nil {
		r.log.Error(err, "listing pods of node", "node", node.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(pods.Items))
	for i := range pods.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&pods.Items[i])})
	}
	return reqs
}

// as is the client of the kubelet of node: what the runtime writes about a node's pods, and
// reads of what they reference, go as that node.
func (r *runtime) as(node string) (client.Client, error) {
	k, err := r.o.Kubelet(node)
	if err != nil {
		return nil, fmt.Errorf("acting as node %s: %w", node, err)
	}
	return k.Client, nil
}

// events is the recorder of the kubelet of pod's node.
func (r *runtime) events(pod *corev1.Pod) events.EventRecorder {
	k, err := r.o.Kubelet(pod.Spec.NodeName)
	if err != nil {
		r.log.Error(err, "no event recorder for node", "node", pod.Spec.NodeName)
		return discard{}
	}
	return k.Events
}

// discard drops Events: a node without credentials cannot record them.
type discard struct{}

func (discard) Eventf(_, _ kruntime.Object, _, _, _, _ string, _ ...any) {}

// enqueue asks for key to be reconciled; safe from any goroutine, also after stop.
func (r *runtime) enqueue(key types.NamespacedName) {
	r.mu.Lock()
	q := r.queue
	r.mu.Unlock()
	if q != nil {
		q.Add(reconcile.Request{NamespacedName: key})
	}
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: processes run where the
// controllers run.
func (r *runtime) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable: it removes the directories of pods that are gone,
// then, when the manager stops, stops every process.
func (r *runtime) Start(ctx context.Context) error {
	if r.cache.WaitForCacheSync(ctx) {
		r.sweep(ctx)
	}
	<-ctx.Done()
	r.stopAll()
	return nil
}

// Reconcile implements reconcile.Reconciler for pods bound to a node.
func (r *runtime) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	r.mu.Lock()
	stopping := r.stopping
	r.mu.Unlock()
	if stopping {
		// The processes are being stopped with the manager: that is no crash to report,
		// and the pods are started again by the next runtime.
		return reconcile.Result{}, nil
	}
	var pod corev1.Pod
	if err := r.c.Get(ctx, req.NamespacedName, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			r.forgetKey(req.NamespacedName, "")
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	// A pod of the same name with another UID is gone (StatefulSets reuse names).
	r.forgetKey(req.NamespacedName, pod.UID)
	if pod.Spec.NodeName == "" {
		return reconcile.Result{}, nil
	}
	var node corev1.Node
	err := r.c.Get(ctx, client.ObjectKey{Name: pod.Spec.NodeName}, &node)
	switch {
	case apierrors.IsNotFound(err):
		return reconcile.Result{}, r.nodeLost(ctx, &pod)
	case err != nil:
		return reconcile.Result{}, err
	case !r.nodes.Matches(labels.Set(node.Labels)):
		// Not (or no longer) a simulated node: someone else's kubelet serves it.
		r.forgetUID(pod.UID, false)
		return reconcile.Result{}, nil
	}
	ps, err := r.ensure(&pod)
	if err != nil {
		return reconcile.Result{}, err
	}
	if pod.DeletionTimestamp != nil {
		return r.terminate(ctx, ps, &pod)
	}
	next := r.sync(ctx, ps, &pod, &node)
	r.mu.Lock()
	report := !terminal(pod.Status.Phase) || ps.launched
	r.mu.Unlock()
	if !report {
		return reconcile.Result{}, nil // finished before this runtime saw it: its status stays
	}
	if err := r.writeStatus(ctx, ps, &pod); err != nil {
		return reconcile.Result{}, err
	}
	if next.IsZero() {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{RequeueAfter: max(time.Until(next), time.Millisecond)}, nil
}

// terminate stops a deleted pod's processes within its grace period, then deletes the
// pod object for good, as kubelet does.
func (r *runtime) terminate(ctx context.Context, ps *podState, pod *corev1.Pod) (reconcile.Result, error) {
	r.mu.Lock()
	ps.finished = true
	r.reap(ps, pod, time.Now())
	live := ps.liveRuns()
	if len(live) > 0 {
		t := time.Now()
		deadline := t.Add(deletionGrace(pod))
		if !ps.terminating || deadline.Before(ps.killAt) {
			ps.killAt = deadline
		}
		if !ps.terminating {
			ps.terminating = true
			for _, c := range ps.all() {
				if c.run != nil && c.run.exit == nil {
					c.run.signal(sigTerm)
					r.events(pod).Eventf(pod, nil, corev1.EventTypeNormal, "Killing", "Kill", "Stopping container %s", c.name)
				}
			}
		}
		wait := ps.killAt.Sub(t)
		if wait <= 0 {
			for _, run := range live {
				run.signal(sigKill)
			}
		}
		r.mu.Unlock()
		// Each process's exit enqueues the pod; the deadline needs a timer.
		if wait > 0 {
			return reconcile.Result{RequeueAfter: wait}, nil
		}
		return reconcile.Result{}, nil
	}
	// As kubelet, the pod object goes only once its volumes are unmounted.
	if r.needsTeardown(ps) {
		r.unmountLater(ps, pod)
		var res reconcile.Result
		if !ps.vols.busy {
			res.RequeueAfter = max(time.Until(ps.vols.notBefore), time.Millisecond)
		}
		r.mu.Unlock()
		return res, nil // the teardown enqueues the pod when it is done
	}
	r.mu.Unlock()
	kc, err := r.as(pod.Spec.NodeName)
	if err != nil {
		return reconcile.Result{}, err
	}
	err = kc.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &pod.UID})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return reconcile.Result{}, fmt.Errorf("deleting terminated pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return reconcile.Result{}, nil
}

// nodeLost handles a pod whose Node is gone. Without a node lifecycle controller, it does
// what kube-controller-manager's pod GC does for such pods: marks them Failed with a
// DisruptionTarget condition and deletes them, so that their controller (a StatefulSet)
// recreates them on a node that exists. Their processes stop; their directory, the
// node's local data, goes with them.
func (r *runtime) nodeLost(ctx context.Context, pod *corev1.Pod) error {
	r.mu.Lock()
	ours := r.pods[pod.UID] != nil
	r.mu.Unlock()
	if !ours && !ranHere(pod) {
		return nil
	}
	r.forgetUID(pod.UID, true)
	// As the lost node: its credentials outlive its Node object, and NodeRestriction lets a
	// node fail and delete the pods bound to it.
	kc, err := r.as(pod.Spec.NodeName)
	if err != nil {
		return err
	}
	if pod.DeletionTimestamp == nil && !terminal(pod.Status.Phase) {
		p := pod.DeepCopy()
		p.Status.Phase = corev1.PodFailed
		setCondition(&p.Status, corev1.PodCondition{
			Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "DeletionByPodGC",
			Message: fmt.Sprintf("PodGC: node %s no longer exists", pod.Spec.NodeName),
		})
		if err := kc.Status().Update(ctx, p); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("marking pod %s/%s of lost node failed: %w", pod.Namespace, pod.Name, err)
		}
	}
	err = kc.Delete(ctx, pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &pod.UID})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting pod %s/%s of lost node: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// ranHere says whether a pod's status was written by a podsim runtime, such as the one
// of an earlier up.
func ranHere(pod *corev1.Pod) bool {
	return pod.Status.HostIP == hostIP && podIPIndexOf(pod.Status.PodIP) >= 0
}

func terminal(p corev1.PodPhase) bool { return p == corev1.PodSucceeded || p == corev1.PodFailed }

// gracePeriod is the pod's termination grace period (default 30 s).
func gracePeriod(pod *corev1.Pod) time.Duration {
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return corev1.DefaultTerminationGracePeriodSeconds * time.Second
}

// deletionGrace is the grace period of a deleted pod: the one its deletion set.
func deletionGrace(pod *corev1.Pod) time.Duration {
	if g := pod.DeletionGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return gracePeriod(pod)
}
