package podsim

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// writeStatus reports the pod's state through the status subresource when it differs
// from what the pod says; on a conflict it reads the pod again and retries.
func (r *runtime) writeStatus(ctx context.Context, ps *podState, pod *corev1.Pod) error {
	kc, err := r.as(pod.Spec.NodeName)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		r.mu.Lock()
		st := r.podStatus(ps, pod)
		r.mu.Unlock()
		if equality.Semantic.DeepEqual(&pod.Status, st) {
			return nil
		}
		p := pod.DeepCopy()
		p.Status = *st
		err := kc.Status().Update(ctx, p)
		switch {
		case err == nil || apierrors.IsNotFound(err):
			return nil
		case !apierrors.IsConflict(err) || attempt >= 3:
			return fmt.Errorf("updating status of pod %s: %w", ps.key, err)
		}
		fresh := &corev1.Pod{}
		if err := r.reader.Get(ctx, client.ObjectKeyFromObject(pod), fresh); err != nil {
			return client.IgnoreNotFound(err)
		}
		if fresh.UID != pod.UID || fresh.DeletionTimestamp != nil {
			return nil // the next reconcile handles it
		}
		pod = fresh
	}
}

// podStatus is the pod's status as kubelet would report it, under mu.
func (r *runtime) podStatus(ps *podState, pod *corev1.Pod) *corev1.PodStatus {
	st := pod.Status.DeepCopy()
	if ps.ip != "" {
		st.PodIP, st.PodIPs = ps.ip, []corev1.PodIP{{IP: ps.ip}}
	}
	st.HostIP, st.HostIPs = hostIP, []corev1.HostIP{{IP: hostIP}}
	if st.StartTime == nil {
		start := ps.start
		st.StartTime = &start
	}
	initDone := ps.initDone()
	st.InitContainerStatuses = nil
	for _, c := range ps.init {
		st.InitContainerStatuses = append(st.InitContainerStatuses, r.containerStatus(c, reasonPodInitializing))
	}
	pending := reasonCreating
	if !initDone {
		pending = reasonPodInitializing
	}
	st.ContainerStatuses = nil
	for _, c := range ps.main {
		st.ContainerStatuses = append(st.ContainerStatuses, r.containerStatus(c, pending))
	}
	if !terminal(st.Phase) {
		st.Phase = phase(ps, pod)
	}

	setCondition(st, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue})
	if ps.ip != "" {
		setCondition(st, corev1.PodCondition{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue})
	}
	if initDone {
		setCondition(st, corev1.PodCondition{Type: corev1.PodInitialized, Status: corev1.ConditionTrue})
	} else {
		var names []string
		for _, c := range ps.init {
			if !c.completed() && !(c.sidecar && c.running()) {
				names = append(names, c.name)
			}
		}
		setCondition(st, corev1.PodCondition{
			Type: corev1.PodInitialized, Status: corev1.ConditionFalse, Reason: "ContainersNotInitialized",
			Message: fmt.Sprintf("containers with incomplete status: [%s]", strings.Join(names, " ")),
		})
	}
	var unready, notes []string
	for _, c := range ps.all() {
		if c.init && !c.sidecar {
			continue
		}
		if !c.ready() {
			unready = append(unready, c.name)
		} else if c.notes != "" {
			notes = append(notes, c.notes)
		}
	}
	containersReady := corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, Message: strings.Join(notes, "; ")}
	if len(unready) > 0 {
		containersReady = corev1.PodCondition{
			Type: corev1.ContainersReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady",
			Message: fmt.Sprintf("containers with unready status: [%s]", strings.Join(unready, " ")),
		}
	}
	if st.Phase == corev1.PodSucceeded {
		containersReady = corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionFalse, Reason: "PodCompleted"}
	}
	ready := containersReady
	ready.Type = corev1.PodReady
	if ready.Status == corev1.ConditionTrue {
		for _, g := range pod.Spec.ReadinessGates {
			if c := condition(st, g.ConditionType); c == nil || c.Status != corev1.ConditionTrue {
				ready = corev1.PodCondition{
					Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ReadinessGatesNotReady",
					Message: fmt.Sprintf("the status of pod readiness gate %q is not \"True\"", g.ConditionType),
				}
				break
			}
		}
	}
	setCondition(st, containersReady)
	setCondition(st, ready)
	return st
}

func (r *runtime) containerStatus(c *ctr, pending string) corev1.ContainerStatus {
	cs := corev1.ContainerStatus{
		Name: c.name, Image: c.spec.Image, RestartCount: c.restarts, Started: ptr.To(false),
	}
	if c.known && (c.ranBefore || c.running()) {
		cs.ImageID = "podsim://" + repository(c.spec.Image)
	}
	switch {
	case c.running():
		cs.State.Running = &corev1.ContainerStateRunning{StartedAt: c.run.startedAt}
		cs.ContainerID = c.run.id
		cs.Started = ptr.To(true)
		cs.Ready = c.run.ready
	case c.term != nil:
		cs.State.Terminated = c.term.DeepCopy()
		cs.ContainerID = c.term.ContainerID
	case c.wait != nil:
		cs.State.Waiting = c.wait.DeepCopy()
	default:
		cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: pending}
	}
	if c.last != nil {
		cs.LastTerminationState.Terminated = c.last.DeepCopy()
		if cs.ContainerID == "" {
			cs.ContainerID = c.last.ContainerID
		}
	}
	return cs
}

// phase is the pod phase by kubelet's rules.
func phase(ps *podState, pod *corev1.Pod) corev1.PodPhase {
	for _, c := range ps.init {
		switch {
		case c.sidecar:
			if !c.running() && !c.ranBefore {
				return corev1.PodPending
			}
		case c.term != nil && c.term.ExitCode != 0:
			return corev1.PodFailed // failed, and the restart policy says no more
		case !c.completed():
			return corev1.PodPending
		}
	}
	running, waiting, stopped, succeeded := 0, 0, 0, 0
	for _, c := range ps.main {
		switch {
		case c.running():
			running++
		case c.term != nil:
			stopped++
			if c.term.ExitCode == 0 {
				succeeded++
			}
		case c.last != nil:
			stopped++ // waiting for its restart
		default:
			waiting++
		}
	}
	switch {
	case waiting > 0:
		return corev1.PodPending
	case running > 0:
		return corev1.PodRunning
	case stopped > 0:
		switch {
		case pod.Spec.RestartPolicy == corev1.RestartPolicyAlways:
			return corev1.PodRunning
		case stopped == succeeded:
			return corev1.PodSucceeded
		case pod.Spec.RestartPolicy == corev1.RestartPolicyNever:
			return corev1.PodFailed
		}
		return corev1.PodRunning
	}
	return corev1.PodPending
}

func condition(st *corev1.PodStatus, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range st.Conditions {
		if st.Conditions[i].Type == t {
			return &st.Conditions[i]
		}
	}
	return nil
}

// setCondition sets a condition, keeping its transition time when its status stays.
func setCondition(st *corev1.PodStatus, c corev1.PodCondition) {
	old := condition(st, c.Type)
	if old == nil {
		c.LastTransitionTime = now()
		st.Conditions = append(st.Conditions, c)
		return
	}
	if old.Status == c.Status {
		c.LastTransitionTime = old.LastTransitionTime
	} else {
		c.LastTransitionTime = now()
	}
	c.LastProbeTime = old.LastProbeTime
	c.ObservedGeneration = old.ObservedGeneration
	*old = c
}

// now is the current time at the resolution the API stores (seconds), so a status
// computed twice compares equal to the stored one.
func now() metav1.Time { return metav1.NewTime(time.Now().Truncate(time.Second)) }
