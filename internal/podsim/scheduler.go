package podsim

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

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

const defaultScheduler = corev1.DefaultSchedulerName

// assumeTTL is how long a binding this scheduler made counts towards its node before the
// cache shows the pod bound; kube-scheduler's assume cache serves the same purpose.
const assumeTTL = 30 * time.Second

// scheduler binds pending pods to simulated nodes: the binding step of kube-scheduler,
// with its NodeName, NodeUnschedulable, NodeAffinity and TaintToleration filters and a
// fewest-pods score. One worker, so its assumptions are consistent.
type scheduler struct {
	c        client.Client
	nodes    labels.Selector
	selector string
	rec      events.EventRecorder
	log      logr.Logger

	mu      sync.Mutex
	assumed map[types.UID]assumption
}

type assumption struct {
	node string
	at   time.Time
}

func addScheduler(mgr manager.Manager, nodes labels.Selector, selector string) error {
	s := &scheduler{
		c:        mgr.GetClient(),
		nodes:    nodes,
		selector: selector,
		rec:      mgr.GetEventRecorder("podsim-scheduler"),
		log:      mgr.GetLogger().WithName("podsim-scheduler"),
		assumed:  map[types.UID]assumption{},
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("podsim-scheduler").
		For(&corev1.Pod{}, builder.WithPredicates(predicate.Funcs{
			CreateFunc:  func(e event.CreateEvent) bool { return needsScheduling(e.Object.(*corev1.Pod)) },
			UpdateFunc:  func(e event.UpdateEvent) bool { return needsScheduling(e.ObjectNew.(*corev1.Pod)) },
			DeleteFunc:  func(event.DeleteEvent) bool { return false },
			GenericFunc: func(e event.GenericEvent) bool { return needsScheduling(e.Object.(*corev1.Pod)) },
		})).
		// A simulated node that appears, becomes Ready or changes labels may fit a
		// pending pod.
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(s.pendingPods),
			builder.WithPredicates(selected(nodes))).
		Complete(s)
}

// needsScheduling: a live pod for the default scheduler that has no node yet and no
// scheduling gates.
func needsScheduling(p *corev1.Pod) bool {
	return p.Spec.NodeName == "" && p.DeletionTimestamp == nil && len(p.Spec.SchedulingGates) == 0 &&
		(p.Spec.SchedulerName == "" || p.Spec.SchedulerName == defaultScheduler) &&
		p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
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

func (s *scheduler) pendingPods(ctx context.Context, _ client.Object) []reconcile.Request {
	var pods corev1.PodList
	if err := s.c.List(ctx, &pods, client.MatchingFields{nodeNameIndex: ""}); err != nil {
		s.log.Error(err, "listing pending pods")
		return nil
	}
	var reqs []reconcile.Request
	for i := range pods.Items {
		if needsScheduling(&pods.Items[i]) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&pods.Items[i])})
		}
	}
	return reqs
}

// Reconcile binds one pending pod, or says why it cannot.
func (s *scheduler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var pod corev1.Pod
	if err := s.c.Get(ctx, req.NamespacedName, &pod); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !needsScheduling(&pod) || s.isAssumed(pod.UID) {
		return reconcile.Result{}, nil
	}
	var nodes corev1.NodeList
	if err := s.c.List(ctx, &nodes, client.MatchingLabelsSelector{Selector: s.nodes}); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing simulated nodes: %w", err)
	}
	node, why, err := s.pick(ctx, &pod, nodes.Items)
	if err != nil {
		return reconcile.Result{}, err
	}
	if node == "" {
		return reconcile.Result{}, s.setUnschedulable(ctx, &pod, why)
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	err = s.c.SubResource("binding").Create(ctx, &pod, binding)
	switch {
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		// Bound already (this cache is behind) or the pod is gone: nothing to do.
		return reconcile.Result{}, nil
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("binding pod %s to %s: %w", req, node, err)
	}
	s.assume(pod.UID, node)
	s.rec.Eventf(&pod, nil, corev1.EventTypeNormal, "Scheduled", "Binding", "Successfully assigned %s/%s to %s", pod.Namespace, pod.Name, node)
	s.log.V(1).Info("bound pod", "pod", req, "node", node)
	return reconcile.Result{}, nil
}

func (s *scheduler) isAssumed(uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.assumed[uid]
	return ok && time.Since(a.at) < assumeTTL
}

func (s *scheduler) assume(uid types.UID, node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.assumed[uid] = assumption{node: node, at: time.Now()}
}

// pick returns the feasible node with the fewest pods (ties: by name), or "" and why none fits.
func (s *scheduler) pick(ctx context.Context, pod *corev1.Pod, nodes []corev1.Node) (string, string, error) {
	if len(nodes) == 0 {
		return "", fmt.Sprintf("no nodes available to schedule pods: no Node matches %s", s.selector), nil
	}
	affinity := nodeaffinity.GetRequiredNodeAffinity(pod)
	reasons := map[string]int{}
	var feasible []string
	for i := range nodes {
		if why := unfit(pod, &nodes[i], affinity); why != "" {
			reasons[why]++
			continue
		}
		feasible = append(feasible, nodes[i].Name)
	}
	if len(feasible) == 0 {
		parts := make([]string, 0, len(reasons))
		for why, n := range reasons {
			parts = append(parts, fmt.Sprintf("%d %s", n, why))
		}
		sort.Strings(parts)
		return "", fmt.Sprintf("0/%d nodes are available: %s.", len(nodes), strings.Join(parts, ", ")), nil
	}
	counts, err := s.podCounts(ctx, feasible)
	if err != nil {
		return "", "", err
	}
	sort.Slice(feasible, func(i, j int) bool {
		a, b := feasible[i], feasible[j]
		if counts[a] != counts[b] {
			return counts[a] < counts[b]
		}
		return a < b
	})
	return feasible[0], "", nil
}

// unfit says why pod cannot run on node, in kube-scheduler's words, or "".
func unfit(pod *corev1.Pod, node *corev1.Node, affinity nodeaffinity.RequiredNodeAffinity) string {
	if node.DeletionTimestamp != nil {
		return "node(s) were being deleted"
	}
	if !nodeIsReady(node) {
		return "node(s) were not ready"
	}
	if node.Spec.Unschedulable && !tolerates(pod, &corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}) {
		return "node(s) were unschedulable"
	}
	if ok, err := affinity.Match(node); err != nil || !ok {
		return "node(s) didn't match Pod's node affinity/selector"
	}
	for i := range node.Spec.Taints {
		t := &node.Spec.Taints[i]
		if t.Effect != corev1.TaintEffectNoSchedule && t.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if conditionTaint(t.Key) {
			continue // the Ready condition, checked above, is what they stand for
		}
		if !tolerates(pod, t) {
			return fmt.Sprintf("node(s) had untolerated taint {%s: %s}", t.Key, t.Value)
		}
	}
	return ""
}

// conditionTaint: the taints the node lifecycle controller derives from the Ready
// condition. Admission (TaintNodesByCondition) puts node.kubernetes.io/not-ready on every
// new Node and only that controller, which up does not run, removes it; so for simulated
// nodes the condition itself decides.
func conditionTaint(key string) bool {
	return key == corev1.TaintNodeNotReady || key == corev1.TaintNodeUnreachable
}

func tolerates(pod *corev1.Pod, t *corev1.Taint) bool {
	for i := range pod.Spec.Tolerations {
		if pod.Spec.Tolerations[i].ToleratesTaint(logr.Discard(), t, false) {
			return true
		}
	}
	return false
}

func nodeIsReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podCounts counts the pods that are not finished on each node, plus the bindings this
// scheduler made that the cache does not show yet.
func (s *scheduler) podCounts(ctx context.Context, nodes []string) (map[string]int, error) {
	counts := map[string]int{}
	seen := map[types.UID]bool{}
	for _, n := range nodes {
		var pods corev1.PodList
		if err := s.c.List(ctx, &pods, client.MatchingFields{nodeNameIndex: n}); err != nil {
			return nil, fmt.Errorf("listing pods of node %s: %w", n, err)
		}
		for i := range pods.Items {
			p := &pods.Items[i]
			seen[p.UID] = true
			if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
				counts[n]++
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for uid, a := range s.assumed {
		switch {
		case seen[uid] || time.Since(a.at) >= assumeTTL:
			delete(s.assumed, uid)
		default:
			counts[a.node]++
		}
	}
	return counts, nil
}

// setUnschedulable reports PodScheduled=False, as kube-scheduler does, when it changes.
func (s *scheduler) setUnschedulable(ctx context.Context, pod *corev1.Pod, msg string) error {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse &&
			c.Reason == corev1.PodReasonUnschedulable && c.Message == msg {
			return nil
		}
	}
	p := pod.DeepCopy()
	cond := corev1.PodCondition{
		Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
		Message: msg, LastTransitionTime: now(),
	}
	replaced := false
	for i, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			if c.Status == cond.Status {
				cond.LastTransitionTime = c.LastTransitionTime
			}
			p.Status.Conditions[i] = cond
			replaced = true
		}
	}
	if !replaced {
		p.Status.Conditions = append(p.Status.Conditions, cond)
	}
	if err := s.c.Status().Update(ctx, p); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("reporting pod %s/%s unschedulable: %w", pod.Namespace, pod.Name, err)
	}
	s.rec.Eventf(pod, nil, corev1.EventTypeWarning, "FailedScheduling", "Scheduling", "%s", msg)
	return nil
}

// now is the current time at the resolution the API stores (seconds), so a status
// computed twice compares equal to the stored one.
func now() metav1.Time { return metav1.NewTime(time.Now().Truncate(time.Second)) }
