package podsim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const (
	sigTerm = syscall.SIGTERM
	sigKill = syscall.SIGKILL
)

// procRun is one process of a container, from start until the runtime reaps its exit.
type procRun struct {
	cmd       *exec.Cmd
	pid       int
	id        string
	startedAt metav1.Time
	ready     bool                             // under runtime.mu
	exit      *corev1.ContainerStateTerminated // set by the waiter, under runtime.mu
	done      chan struct{}                    // closed after exit is set
}

// signal signals the process's group (the process and whatever it started), unless it
// is known to be gone.
func (p *procRun) signal(sig syscall.Signal) {
	select {
	case <-p.done:
	default:
		_ = syscall.Kill(-p.pid, sig)
	}
}

// stopRuns sends SIGTERM, waits up to grace, sends SIGKILL to what is left and waits for
// every process to be reaped.
func stopRuns(runs []*procRun, grace time.Duration) {
	for _, p := range runs {
		p.signal(sigTerm)
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	for _, p := range runs {
		select {
		case <-p.done:
		case <-timer.C:
			for _, q := range runs {
				q.signal(sigKill)
			}
			for _, q := range runs {
				<-q.done
			}
			return
		}
	}
}

// prepared is a process ready to start: its command, its forwarders listening.
type prepared struct {
	cmd    *exec.Cmd
	fwd    map[int32]string
	fwds   []*forwarder
	log    *os.File
	mounts []bindMount // run in a mount namespace of its own with these, when any
}

func (p *prepared) discard() {
	for _, f := range p.fwds {
		f.close()
	}
	p.log.Close()
}

// prepare builds container c's process: its environment, expanded command, volume
// mounts, the image's command, forwarders and log file. A problem comes back as the
// waiting state kubelet would report.
func (r *runtime) prepare(ctx context.Context, pod *corev1.Pod, node *corev1.Node, c *ctr, ip, dir string, vols map[string]volPath) (*prepared, *corev1.ContainerStateWaiting) {
	env, err := r.env.containerEnv(ctx, pod, &c.spec, ip, node)
	if err != nil {
		return nil, &corev1.ContainerStateWaiting{Reason: reasonConfigError, Message: err.Error()}
	}
	mounts, err := containerMounts(&c.spec, vols, env)
	if err != nil {
		return nil, &corev1.ContainerStateWaiting{Reason: reasonConfigError, Message: err.Error()}
	}
	if len(mounts) > 0 {
		if err := mountNamespaces(); err != nil {
			for _, m := range mounts {
				if m.csi {
					return nil, &corev1.ContainerStateWaiting{Reason: reasonRunError, Message: fmt.Sprintf("mounting volumes of container %s: %v", c.name, err)}
				}
			}
			// Only emptyDirs: the container runs as it did before podsim mounted volumes,
			// its emptyDirs under the pod's directory but not at their mountPath.
			mounts = nil
		}
	}
	spec := c.spec.DeepCopy()
	spec.Command, spec.Args = expandCommand(&c.spec, env)
	// The image sees the volume mounts the process really gets: none where the node cannot
	// make mount namespaces (only emptyDirs then, left unmounted).
	spec.VolumeMounts = nil
	for _, vm := range c.spec.VolumeMounts {
		for _, m := range mounts {
			if m.dst == vm.MountPath {
				spec.VolumeMounts = append(spec.VolumeMounts, vm)
				break
			}
		}
	}
	img := r.images[repository(c.spec.Image)]
	proc, err := img.Command(pod, spec, ip, env, dir)
	if err == nil && (proc == nil || proc.Cmd == nil) {
		err = errors.New("the image returned no command")
	}
	if err != nil {
		return nil, &corev1.ContainerStateWaiting{Reason: reasonRunError, Message: fmt.Sprintf("image %s: %v", c.spec.Image, err)}
	}
	p := &prepared{cmd: proc.Cmd, fwd: proc.Forward, mounts: mounts}
	ports := make([]int, 0, len(proc.Forward))
	for port := range proc.Forward {
		ports = append(ports, int(port))
	}
	sort.Ints(ports)
	for _, port := range ports {
		f, err := listenForward(ip, int32(port), proc.Forward[int32(port)])
		if err != nil {
			p.discard()
			return nil, &corev1.ContainerStateWaiting{Reason: reasonRunError, Message: err.Error()}
		}
		p.fwds = append(p.fwds, f)
	}
	p.log, err = os.OpenFile(filepath.Join(dir, c.name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.discard()
		return nil, &corev1.ContainerStateWaiting{Reason: reasonRunError, Message: fmt.Sprintf("opening log: %v", err)}
	}
	cmd := p.cmd
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if cmd.Dir == "" {
		cmd.Dir = dir
	}
	if cmd.Env == nil {
		cmd.Env = processEnv(env, pod, dir)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// Its own process group, so that stopping the container stops what it started; and
	// killed with up, should up die without stopping it.
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pgid = 0
	setDeathSignal(cmd.SysProcAttr)
	return p, nil
}

// launchProcess starts a prepared process for c, under mu, with its forwarders, readiness
// prober and waiter.
func (r *runtime) launchProcess(ps *podState, c *ctr, p *prepared, pod *corev1.Pod, ip string) error {
	if r.stopping || ps.finished || r.pods[ps.uid] != ps {
		p.discard()
		return nil
	}
	done := make(chan struct{})
	var err error
	if len(p.mounts) > 0 {
		var created []string
		created, err = startInMountNamespace(p.cmd, p.mounts, done)
		dsts := make([]string, 0, len(p.mounts))
		for _, m := range p.mounts {
			dsts = append(dsts, m.dst)
		}
		r.useHostDirs(ps.uid, created, dsts)
	} else {
		if r.launch == nil {
			r.launch = newLauncher()
		}
		err = r.launch.start(p.cmd)
	}
	p.log.Close()
	if err != nil {
		for _, f := range p.fwds {
			f.close()
		}
		return fmt.Errorf("starting %s: %w", p.cmd.Path, err)
	}
	run := &procRun{cmd: p.cmd, pid: p.cmd.Process.Pid, startedAt: now(), done: done}
	run.id = containerID(run.pid)
	if c.ranBefore {
		c.restarts++
	}
	c.ranBefore, ps.launched = true, true
	c.run, c.wait, c.term, c.notes = run, nil, nil, ""
	ctx, cancel := context.WithCancel(context.Background())
	switch probe := c.spec.ReadinessProbe; {
	case probe == nil:
		run.ready = true
	case probe.TCPSocket == nil && probe.HTTPGet == nil:
		run.ready = true
		c.notes = fmt.Sprintf("podsim runs only tcpSocket and httpGet readiness probes; container %s is treated as ready", c.name)
	default:
		pr := &prober{probe: probe, container: &c.spec, ip: ip, forward: p.fwd}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			pr.run(ctx, func(ready bool) {
				r.mu.Lock()
				changed := run.exit == nil && run.ready != ready
				if changed {
					run.ready = ready
				}
				r.mu.Unlock()
				if changed {
					r.enqueue(ps.key)
				}
			})
		}()
	}
	for _, f := range p.fwds {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			f.serve(&r.wg)
		}()
	}
	r.wg.Add(1)
	go r.wait(ps.key, run, cancel, p.fwds)
	r.events(pod).Eventf(pod, nil, corev1.EventTypeNormal, "Started", "Start", "Started container %s (pid %d)", c.name, run.pid)
	return nil
}

// wait reaps a process, stops what belongs to it and records its exit.
func (r *runtime) wait(key types.NamespacedName, run *procRun, cancel context.CancelFunc, fwds []*forwarder) {
	defer r.wg.Done()
	_ = run.cmd.Wait()
	code := exitCode(run.cmd.ProcessState)
	// The container ends with its main process: so does what it left in its group.
	_ = syscall.Kill(-run.pid, syscall.SIGKILL)
	cancel()
	for _, f := range fwds {
		f.close()
	}
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	ex := &corev1.ContainerStateTerminated{
		ExitCode: code, Reason: reason, StartedAt: run.startedAt, FinishedAt: now(), ContainerID: run.id,
	}
	r.mu.Lock()
	run.exit = ex
	run.ready = false
	r.mu.Unlock()
	close(run.done)
	r.enqueue(key)
}

// exitCode is the exit code a container runtime reports: 128+signal for a signalled
// process.
func exitCode(ps *os.ProcessState) int32 {
	if ps == nil {
		return 128
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int32(ws.Signal())
	}
	return int32(ps.ExitCode())
}

// launcher starts processes from one OS thread that lives as long as the runtime:
// Pdeathsig fires when the thread that started a process ends, not the process, and Go
// ends threads of its own accord.
type launcher struct {
	reqs chan launchReq
	done chan struct{}
}

type launchReq struct {
	cmd *exec.Cmd
	err chan error
}

func newLauncher() *launcher {
	l := &launcher{reqs: make(chan launchReq), done: make(chan struct{})}
	go func() {
		// Never unlocked: the thread ends with this goroutine, after every process.
		goruntime.LockOSThread()
		defer close(l.done)
		for req := range l.reqs {
			req.err <- req.cmd.Start()
		}
	}()
	return l
}

func (l *launcher) start(cmd *exec.Cmd) error {
	req := launchReq{cmd: cmd, err: make(chan error, 1)}
	l.reqs <- req
	return <-req.err
}

func (l *launcher) close() {
	close(l.reqs)
	<-l.done
}
