package podsim

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Container state reasons, as kubelet reports them, plus podsim's own.
const (
	ReasonImageNotSimulated = "ImageNotSimulated"
	reasonCrashLoopBackOff  = "CrashLoopBackOff"
	reasonConfigError       = "CreateContainerConfigError"
	reasonRunError          = "RunContainerError"
	reasonCreating          = "ContainerCreating"
	reasonPodInitializing   = "PodInitializing"
)

// backoffReset: a container that ran this long before it exited restarts after the
// initial back-off again (kubelet forgets a back-off after twice its 5-minute cap).
const backoffReset = 10 * time.Minute

// podState is what the runtime knows of one pod (one UID). Guarded by runtime.mu.
type podState struct {
	uid   types.UID
	key   types.NamespacedName
	dir   string
	ip    string
	grace time.Duration
	start metav1.Time
	init  []*ctr
	main  []*ctr
	// finished: nothing is (re)started any more (the pod is terminal or being deleted).
	finished bool
	// launched: this runtime started a process for the pod; only then does it report
	// the status of a pod that is already terminal.
	launched    bool
	terminating bool
	killAt      time.Time
	vols        podVolumes
}

// ctr is one container of a pod.
type ctr struct {
	spec      corev1.Container
	name      string
	init      bool
	sidecar   bool // an init container with restartPolicy Always
	known     bool // its image is simulated
	ranBefore bool // a process ran for it before (in this up or an earlier one)
	restarts  int32
	run       *procRun                         // the current process, until reaped
	term      *corev1.ContainerStateTerminated // current state when it will not run again
	last      *corev1.ContainerStateTerminated // lastState
	wait      *corev1.ContainerStateWaiting    // why it does not run, when it does not
	notBefore time.Time                        // back-off
	backoff   time.Duration                    // current back-off step
	notes     string                           // readiness notes (unsupported probes)
}

func newPodState(pod *corev1.Pod, root string, known func(string) bool) *podState {
	ps := &podState{
		uid:   pod.UID,
		key:   types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name},
		dir:   filepath.Join(root, string(pod.UID)),
		grace: gracePeriod(pod),
		start: now(),
		vols:  podVolumes{needed: needsVolumes(pod)},
	}
	if pod.Status.StartTime != nil {
		ps.start = *pod.Status.StartTime
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		ps.init = append(ps.init, newCtr(pod, c, true, podStatusOf(pod.Status.InitContainerStatuses, c.Name), known(c.Image)))
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		ps.main = append(ps.main, newCtr(pod, c, false, podStatusOf(pod.Status.ContainerStatuses, c.Name), known(c.Image)))
	}
	return ps
}

func podStatusOf(statuses []corev1.ContainerStatus, name string) *corev1.ContainerStatus {
	for i := range statuses {
		if statuses[i].Name == name {
			return &statuses[i]
		}
	}
	return nil
}

// newCtr takes over what an earlier runtime reported: restart count, last state, and
// a process that was running then and is not any more (it ended with that up).
func newCtr(pod *corev1.Pod, spec *corev1.Container, init bool, old *corev1.ContainerStatus, known bool) *ctr {
	c := &ctr{
		spec:    *spec.DeepCopy(),
		name:    spec.Name,
		init:    init,
		sidecar: init && spec.RestartPolicy != nil && *spec.RestartPolicy == corev1.ContainerRestartPolicyAlways,
		known:   known,
	}
	if old == nil {
		return c
	}
	c.restarts = old.RestartCount
	c.last = old.LastTerminationState.Terminated.DeepCopy()
	c.ranBefore = c.restarts > 0 || c.last != nil
	switch {
	case old.State.Running != nil:
		c.ranBefore = true
		c.exited(pod, &corev1.ContainerStateTerminated{
			ExitCode:    255,
			Reason:      "Unknown",
			Message:     "the process ended with the crdipc up that ran it",
			StartedAt:   old.State.Running.StartedAt,
			FinishedAt:  now(),
			ContainerID: old.ContainerID,
		}, time.Time{}, 0)
	case old.State.Terminated != nil:
		c.ranBefore = true
		c.exited(pod, old.State.Terminated.DeepCopy(), time.Time{}, 0)
	}
	return c
}

// shouldRestart applies the restart policy to an exit.
func (c *ctr) shouldRestart(pod *corev1.Pod, code int32) bool {
	switch {
	case c.sidecar:
		return true
	case c.init:
		return code != 0 && pod.Spec.RestartPolicy != corev1.RestartPolicyNever
	}
	switch pod.Spec.RestartPolicy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	}
	return true
}

// exited records an exit: the container waits for its restart at notBefore, or stays
// terminated.
func (c *ctr) exited(pod *corev1.Pod, ex *corev1.ContainerStateTerminated, notBefore time.Time, backoff time.Duration) {
	c.run = nil
	if !c.shouldRestart(pod, ex.ExitCode) {
		c.term, c.wait = ex, nil
		return
	}
	c.last, c.term = ex, nil
	c.notBefore, c.backoff = notBefore, backoff
	c.wait = nil
	if backoff > 0 {
		c.wait = &corev1.ContainerStateWaiting{
			Reason: reasonCrashLoopBackOff,
			Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)",
				backoff, c.name, pod.Name, pod.Namespace, pod.UID),
		}
	}
}

func (c *ctr) running() bool   { return c.run != nil && c.run.exit == nil }
func (c *ctr) completed() bool { return c.term != nil && c.term.ExitCode == 0 }

// ready: running, and its readiness probe (if any) succeeds.
func (c *ctr) ready() bool { return c.running() && c.run.ready }

func (ps *podState) all() []*ctr {
	return append(append([]*ctr(nil), ps.init...), ps.main...)
}

// liveRuns are the processes that have not exited.
func (ps *podState) liveRuns() []*procRun {
	var runs []*procRun
	for _, c := range ps.all() {
		if c.running() {
			runs = append(runs, c.run)
		}
	}
	return runs
}

// reap turns the exits the waiters recorded into container state, with kubelet's
// back-off: 10 s, doubling up to 5 min, reset after a long run.
func (r *runtime) reap(ps *podState, pod *corev1.Pod, t time.Time) {
	for _, c := range ps.all() {
		if c.run == nil || c.run.exit == nil {
			continue
		}
		ex := c.run.exit
		if ps.finished {
			c.run = nil
			c.term, c.wait = ex, nil
			continue
		}
		backoff := c.backoff
		if ex.FinishedAt.Sub(ex.StartedAt.Time) >= backoffReset {
			backoff = 0
		}
		if backoff == 0 {
			backoff = r.o.RestartBackoff
		} else {
			backoff = min(2*backoff, r.o.MaxRestartBackoff)
		}
		c.exited(pod, ex, t.Add(backoff), backoff)
		if c.wait != nil {
			r.events(pod).Eventf(pod, nil, corev1.EventTypeWarning, "BackOff", "Restart",
				"Back-off restarting failed container %s in pod %s_%s(%s)", c.name, pod.Name, pod.Namespace, pod.UID)
		}
	}
}

// initDone says whether the init containers let the regular containers start: every
// regular one completed and every sidecar started.
func (ps *podState) initDone() bool {
	for _, c := range ps.init {
		if c.sidecar {
			if !c.running() && !c.ranBefore {
				return false
			}
			continue
		}
		if !c.completed() {
			return false
		}
	}
	return true
}

// plan decides, under mu, which containers to start now and when to look again.
func (r *runtime) plan(ps *podState, pod *corev1.Pod, t time.Time) (start []*ctr, next time.Time) {
	consider := func(c *ctr) {
		if t.Before(c.notBefore) {
			if next.IsZero() || c.notBefore.Before(next) {
				next = c.notBefore
			}
			return
		}
		start = append(start, c)
	}
	for _, c := range ps.init {
		if !c.known {
			c.wait = r.notSimulated(c)
			return nil, next
		}
		if c.sidecar {
			if !c.running() {
				consider(c)
				if !c.ranBefore {
					return start, next // the next init container waits for this one
				}
			}
			continue
		}
		switch {
		case c.completed():
			continue
		case c.running() || c.term != nil: // running, or failed for good
		default:
			consider(c)
		}
		return start, next
	}
	for _, c := range ps.main {
		switch {
		case !c.known:
			c.wait = r.notSimulated(c)
		case c.running() || c.term != nil:
		default:
			consider(c)
		}
	}
	return start, next
}

func (r *runtime) notSimulated(c *ctr) *corev1.ContainerStateWaiting {
	msg := fmt.Sprintf("image %q is not simulated: crdipc up runs no image of its own", c.spec.Image)
	if len(r.names) > 0 {
		msg = fmt.Sprintf("image %q is not simulated: crdipc up runs only the images %v", c.spec.Image, r.names)
	}
	return &corev1.ContainerStateWaiting{Reason: ReasonImageNotSimulated, Message: msg}
}

// sync starts the containers that should run and returns when to look again.
func (r *runtime) sync(ctx context.Context, ps *podState, pod *corev1.Pod, node *corev1.Node) time.Time {
	t := time.Now()
	r.mu.Lock()
	if r.stopping {
		r.mu.Unlock()
		return time.Time{}
	}
	if terminal(pod.Status.Phase) && !ps.finished {
		ps.finished = true
		r.stopLater(ps)
	}
	r.reap(ps, pod, t)
	if ps.finished {
		// Kubelet unmounts the volumes of a pod that is done, as soon as nothing runs.
		var next time.Time
		if len(ps.liveRuns()) == 0 && r.needsTeardown(ps) {
			r.unmountLater(ps, pod)
			if !ps.vols.busy {
				next = ps.vols.notBefore
			}
		}
		r.mu.Unlock()
		return next
	}
	if err := r.assignIP(ps, pod); err != nil {
		for _, c := range ps.all() {
			if !c.running() && c.term == nil {
				c.wait = &corev1.ContainerStateWaiting{Reason: reasonRunError, Message: err.Error()}
			}
		}
		r.mu.Unlock()
		return t.Add(r.o.RestartBackoff)
	}
	if ps.vols.needed && !ps.vols.ready {
		next := r.awaitVolumes(ps, pod, t)
		r.mu.Unlock()
		return next
	}
	start, next := r.plan(ps, pod, t)
	ip, dir, vols := ps.ip, ps.dir, ps.vols.paths
	r.mu.Unlock()

	for _, c := range start {
		p, waiting := r.prepare(ctx, pod, node, c, ip, dir, vols)
		r.mu.Lock()
		if waiting == nil {
			if err := r.launchProcess(ps, c, p, pod, ip); err != nil {
				waiting = &corev1.ContainerStateWaiting{Reason: reasonRunError, Message: err.Error()}
			}
		}
		if waiting != nil {
			// Not startable now: retry after the first back-off step, like a crash,
			// without counting a restart.
			c.backoff = r.o.RestartBackoff
			c.notBefore = t.Add(c.backoff)
			c.wait = waiting
			if next.IsZero() || c.notBefore.Before(next) {
				next = c.notBefore
			}
			r.events(pod).Eventf(pod, nil, corev1.EventTypeWarning, "Failed", "Start", "Error: %s", waiting.Message)
		} else if c.sidecar {
			// A started sidecar lets the next init container start: look again at once.
			next = t
		}
		r.mu.Unlock()
	}
	return next
}

// stopLater stops a finished pod's remaining processes (sidecars) in the background,
// under mu.
func (r *runtime) stopLater(ps *podState) {
	runs := ps.liveRuns()
	if len(runs) == 0 || r.stopping {
		return
	}
	grace := ps.grace
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		stopRuns(runs, grace)
	}()
}

func containerID(pid int) string { return "podsim://" + strconv.Itoa(pid) }
