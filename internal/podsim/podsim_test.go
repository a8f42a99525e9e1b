package podsim_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// TestRunsPod: a pod that kube-scheduler binds to a simulated node runs with its
// environment (a Secret, downward-API fields, $(VAR) expansion) and becomes Ready through
// its tcpSocket readiness probe; the status reads as kubelet's, and stays put once written.
func TestRunsPod(t *testing.T) {
	s := newSim(t, "a", "b")
	s.start()
	ctx := context.Background()
	s.create(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "greeting"},
		Data:       map[string][]byte{"message": []byte("hello from a secret")},
	})
	pod := s.pod("web", "-greeting=$(GREETING)", "-literal=$$(GREETING)")
	c := &pod.Spec.Containers[0]
	c.Env = append(c.Env,
		corev1.EnvVar{Name: "GREETING", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "greeting"}, Key: "message",
		}}},
		corev1.EnvVar{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		corev1.EnvVar{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		corev1.EnvVar{Name: "WHERE", Value: "$(POD_NAME) on $(NODE)"},
	)
	s.create(pod)

	pod = s.waitPod("web", "Ready", isReady)
	st := pod.Status
	if pod.Spec.NodeName != s.node("a") && pod.Spec.NodeName != s.node("b") {
		t.Fatalf("bound to %q, not to one of the test's nodes", pod.Spec.NodeName)
	}
	if st.Phase != corev1.PodRunning || !strings.HasPrefix(st.PodIP, "127.2.") || len(st.PodIPs) != 1 || st.PodIPs[0].IP != st.PodIP ||
		st.HostIP != "127.0.0.1" || st.StartTime == nil {
		t.Fatalf("status: phase %s, podIP %q %v, hostIP %q, startTime %v", st.Phase, st.PodIP, st.PodIPs, st.HostIP, st.StartTime)
	}
	for _, ct := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		if c := podCondition(pod, ct); c == nil || c.Status != corev1.ConditionTrue {
			t.Errorf("condition %s = %+v", ct, c)
		}
	}
	if len(st.ContainerStatuses) != 1 {
		t.Fatalf("container statuses: %+v", st.ContainerStatuses)
	}
	cs := st.ContainerStatuses[0]
	if cs.State.Running == nil || !cs.Ready || cs.Started == nil || !*cs.Started || cs.RestartCount != 0 ||
		cs.Image != helperImageName || cs.ImageID == "" || !strings.HasPrefix(cs.ContainerID, "podsim://") {
		t.Fatalf("container status: %+v", cs)
	}

	in, err := getInfo(net.JoinHostPort(st.PodIP, "8080"))
	if err != nil {
		t.Fatalf("asking the pod's process: %v", err)
	}
	if in.PID != pidOf(t, cs) {
		t.Errorf("process pid %d, container ID %s", in.PID, cs.ContainerID)
	}
	if !slices.Contains(in.Args, "-greeting=hello from a secret") || !slices.Contains(in.Args, "-literal=$(GREETING)") ||
		!slices.Contains(in.Args, st.PodIP+":8080") {
		t.Errorf("args not expanded as kubelet expands them: %q", in.Args)
	}
	if want := "web on " + pod.Spec.NodeName; in.Env["GREETING"] != "hello from a secret" || in.Env["WHERE"] != want || in.Env["POD_IP"] != st.PodIP {
		t.Errorf("environment: GREETING=%q WHERE=%q (want %q) POD_IP=%q", in.Env["GREETING"], in.Env["WHERE"], want, in.Env["POD_IP"])
	}
	dir := filepath.Join(s.root, string(pod.UID))
	if in.Dir != dir {
		t.Errorf("working directory %s, want the pod directory %s", in.Dir, dir)
	}
	if log, err := os.ReadFile(filepath.Join(dir, "server.log")); err != nil || !strings.Contains(string(log), "helper server started") {
		t.Errorf("container log: %q, %v", log, err)
	}

	// Nothing changes, so nothing is written: three probe periods, one resourceVersion.
	// The look fails the test at the first write; it never reports done, so the wait lasts
	// the three periods, and one more look after it must find the pod readable.
	rv := pod.ResourceVersion
	unchanged := func(ctx context.Context) (bool, error) {
		var p corev1.Pod
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil {
			return false, err
		}
		if p.ResourceVersion != rv {
			t.Fatalf("pod written again without a change: %+v\nwas %+v", p.Status, pod.Status)
		}
		return false, nil
	}
	_ = wait.Until(ctx, 3*time.Second, unchanged)
	if _, err := unchanged(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestScheduling: the control plane's kube-scheduler binds pods onto simulated nodes and
// the runtime runs them. Two pods go to two empty nodes; a pod whose nodeSelector
// matches no node stays Pending and Unschedulable, and is bound and runs once a node
// matches.
func TestScheduling(t *testing.T) {
	s := newSim(t, "a", "b")
	s.start()
	ctx := context.Background()
	s.create(s.pod("one"))
	one := s.waitPod("one", "Ready", isReady)
	s.create(s.pod("two"))
	two := s.waitPod("two", "Ready", isReady)
	for _, p := range []*corev1.Pod{one, two} {
		if p.Spec.NodeName != s.node("a") && p.Spec.NodeName != s.node("b") {
			t.Fatalf("%s bound to %q, not to one of the test's nodes", p.Name, p.Spec.NodeName)
		}
	}
	// kube-scheduler's scores decide, and deterministically here: NodeResourcesFit
	// (LeastAllocated) counts a pod without requests as 100m CPU and 200 MB, so the node
	// that runs one scores lower (95 against 97 for cpu and memory on these 4-core, 8 GiB
	// nodes); no other plugin of the default profile tells the two nodes apart.
	if one.Spec.NodeName == two.Spec.NodeName {
		t.Errorf("both pods on %s; the second should go to the empty node", one.Spec.NodeName)
	}

	picky := s.pod("picky")
	picky.Spec.NodeSelector["disk"] = "ssd"
	s.create(picky)
	picky = s.waitPod("picky", "Unschedulable", func(p *corev1.Pod) bool {
		c := podCondition(p, corev1.PodScheduled)
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable
	})
	// kube-scheduler counts every node of the control plane, not only this test's.
	msg := podCondition(picky, corev1.PodScheduled).Message
	if !strings.Contains(msg, "nodes are available") || !strings.Contains(msg, "didn't match Pod's node affinity/selector") {
		t.Errorf("unschedulable message: %q", msg)
	}
	if picky.Spec.NodeName != "" || picky.Status.Phase != corev1.PodPending {
		t.Errorf("unschedulable pod: node %q, phase %s", picky.Spec.NodeName, picky.Status.Phase)
	}

	var node corev1.Node
	if err := s.c.Get(ctx, client.ObjectKey{Name: s.node("b")}, &node); err != nil {
		t.Fatal(err)
	}
	// A patch, not an update: the node's heartbeat writes it meanwhile.
	before := client.MergeFrom(node.DeepCopy())
	node.Labels["disk"] = "ssd"
	if err := s.c.Patch(ctx, &node, before); err != nil {
		t.Fatal(err)
	}
	// The label update requeues the pod, after kube-scheduler's back-off (1 s, doubling
	// up to 10 s) for a pod that failed to schedule.
	picky = s.waitPodWithin(60*time.Second, "picky", "Ready on the node that matches now", isReady)
	if picky.Spec.NodeName != s.node("b") {
		t.Errorf("picky pod on %s, want %s", picky.Spec.NodeName, s.node("b"))
	}
}

// TestCrashRestarts: a process that exits is restarted with back-off, and the status
// shows the restarts, the last exit code and CrashLoopBackOff in between.
func TestCrashRestarts(t *testing.T) {
	s := newSim(t, "a")
	s.start()
	s.create(s.pod("crashy", "-exit-after=300ms", "-exit-code=3"))
	sawBackOff := false
	s.waitPod("crashy", "restarted twice after exit code 3", func(p *corev1.Pod) bool {
		if len(p.Status.ContainerStatuses) != 1 {
			return false
		}
		cs := p.Status.ContainerStatuses[0]
		if w := cs.State.Waiting; w != nil && w.Reason == "CrashLoopBackOff" {
			sawBackOff = true
			if p.Status.Phase != corev1.PodRunning {
				t.Errorf("phase %s in CrashLoopBackOff, want Running as kubelet reports", p.Status.Phase)
			}
		}
		last := cs.LastTerminationState.Terminated
		return cs.RestartCount >= 2 && last != nil && last.ExitCode == 3 && last.Reason == "Error"
	})
	if !sawBackOff {
		t.Error("never saw the container waiting in CrashLoopBackOff")
	}
}

// TestImageNotSimulated: a container (or init container) whose image up cannot run
// waits with reason ImageNotSimulated, naming the images it can; the pod stays Pending.
// Init containers of a known image run to completion before the containers start.
func TestImageNotSimulated(t *testing.T) {
	s := newSim(t, "a")
	s.start()
	pod := s.pod("nginx")
	pod.Spec.Containers[0].Image = "nginx:1.27"
	s.create(pod)
	pod = s.waitPod("nginx", "ImageNotSimulated", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "ImageNotSimulated"
	})
	if msg := pod.Status.ContainerStatuses[0].State.Waiting.Message; !strings.Contains(msg, "nginx:1.27") || !strings.Contains(msg, "podsim.test/helper") {
		t.Errorf("message %q should name the image and the images up runs", msg)
	}
	if pod.Status.Phase != corev1.PodPending || isReady(pod) {
		t.Errorf("phase %s, ready %v; want Pending, not ready", pod.Status.Phase, isReady(pod))
	}

	blocked := s.pod("blocked")
	blocked.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: "docker.io/library/busybox"}}
	s.create(blocked)
	blocked = s.waitPod("blocked", "init container ImageNotSimulated", func(p *corev1.Pod) bool {
		ics := p.Status.InitContainerStatuses
		return len(ics) == 1 && ics[0].State.Waiting != nil && ics[0].State.Waiting.Reason == "ImageNotSimulated"
	})
	if cs := blocked.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Waiting == nil || cs[0].State.Waiting.Reason != "PodInitializing" {
		t.Errorf("container of a pod stuck in init: %+v", cs)
	}
	if c := podCondition(blocked, corev1.PodInitialized); c == nil || c.Status != corev1.ConditionFalse || blocked.Status.Phase != corev1.PodPending {
		t.Errorf("Initialized = %+v, phase %s", c, blocked.Status.Phase)
	}

	withInit := s.pod("with-init")
	withInit.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: helperImageName, Args: []string{"-exit-now"}}}
	s.create(withInit)
	withInit = s.waitPod("with-init", "Ready after its init container", isReady)
	ics := withInit.Status.InitContainerStatuses
	if len(ics) != 1 || ics[0].State.Terminated == nil || ics[0].State.Terminated.ExitCode != 0 || ics[0].State.Terminated.Reason != "Completed" {
		t.Errorf("init container status: %+v", ics)
	}
	starts, _ := os.ReadFile(filepath.Join(s.root, string(withInit.UID), "starts"))
	if lines := strings.Fields(string(starts)); len(lines) != 4 || lines[0] != "setup" || lines[2] != "server" {
		t.Errorf("start order: %q; want setup, then server", starts)
	}
}

// TestDeletion: deleting a pod stops its process (SIGTERM; SIGKILL after the grace
// period for one that ignores SIGTERM), deletes the pod object and its directory.
func TestDeletion(t *testing.T) {
	s := newSim(t, "a")
	s.start()
	ctx := context.Background()
	s.create(s.pod("polite"))
	stubborn := s.pod("stubborn", "-ignore-term")
	stubborn.Spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
	s.create(stubborn)
	for _, name := range []string{"polite", "stubborn"} {
		pod := s.waitPod(name, "Ready", isReady)
		pid := pidOf(t, pod.Status.ContainerStatuses[0])
		dir := filepath.Join(s.root, string(pod.UID))
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("pod directory: %v", err)
		}
		if err := s.c.Delete(ctx, pod); err != nil {
			t.Fatal(err)
		}
		s.waitGone(name)
		if !processGone(pid) {
			t.Errorf("%s: pod deleted while its process %d runs", name, pid)
		}
		testenv.Eventually(t, 30*time.Second, name+"'s directory removed", func(context.Context) (bool, error) {
			_, err := os.Stat(dir)
			if !os.IsNotExist(err) {
				return false, fmt.Errorf("stat %s: %v", dir, err)
			}
			return true, nil
		})
	}
}

// TestRestartOfUp: when the runtime stops, its processes stop and the pods stay; a new
// runtime on the same root starts them again with the same IP and directory and one
// more restart.
func TestRestartOfUp(t *testing.T) {
	s := newSim(t, "a")
	first := s.start()
	s.create(s.pod("durable"))
	before := s.waitPod("durable", "Ready", isReady)
	pid := pidOf(t, before.Status.ContainerStatuses[0])

	s.stop(first)
	if !processGone(pid) {
		t.Fatalf("process %d still runs after its runtime stopped", pid)
	}
	s.start()
	after := s.waitPod("durable", "Ready again with one restart", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return isReady(p) && len(cs) == 1 && cs[0].RestartCount == 1 && cs[0].ContainerID != before.Status.ContainerStatuses[0].ContainerID
	})
	if after.UID != before.UID || after.Status.PodIP != before.Status.PodIP {
		t.Errorf("pod %s at %s after the restart, was %s at %s", after.UID, after.Status.PodIP, before.UID, before.Status.PodIP)
	}
	if last := after.Status.ContainerStatuses[0].LastTerminationState.Terminated; last == nil || last.Reason != "Unknown" {
		t.Errorf("lastState after a restart of up: %+v", last)
	}
	starts, err := os.ReadFile(filepath.Join(s.root, string(after.UID), "starts"))
	if err != nil || len(strings.Split(strings.TrimSpace(string(starts)), "\n")) != 2 {
		t.Errorf("pod directory should hold both starts: %q, %v", starts, err)
	}
	if _, err := getInfo(net.JoinHostPort(after.Status.PodIP, "8080")); err != nil {
		t.Errorf("restarted pod does not serve on its IP: %v", err)
	}
}

// TestForward: a process that listens elsewhere is reached on podIP:port through the
// runtime's forwarder, and its httpGet readiness probe goes where it really listens.
func TestForward(t *testing.T) {
	s := newSim(t, "a")
	s.start()
	pod := s.pod("forwarded")
	pod.Spec.Containers[0].Image = forwardImageName
	pod.Spec.Containers[0].Args = nil
	pod.Spec.Containers[0].ReadinessProbe.ProbeHandler = corev1.ProbeHandler{
		HTTPGet: &corev1.HTTPGetAction{Path: "/info", Port: intstr.FromInt32(8080)},
	}
	s.create(pod)
	pod = s.waitPod("forwarded", "Ready", isReady)
	in, err := getInfo(net.JoinHostPort(pod.Status.PodIP, "8080"))
	if err != nil {
		t.Fatalf("through the forwarder: %v", err)
	}
	if in.PID != pidOf(t, pod.Status.ContainerStatuses[0]) {
		t.Errorf("answered by pid %d, not the container's", in.PID)
	}
}

// TestNodeDeleted: a deleted simulated node takes its pods with it (pod GC's part).
func TestNodeDeleted(t *testing.T) {
	s := newSim(t, "a")
	s.start()
	s.create(s.pod("orphan"))
	pod := s.waitPod("orphan", "Ready", isReady)
	pid := pidOf(t, pod.Status.ContainerStatuses[0])
	if err := s.c.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: pod.Spec.NodeName}}); err != nil {
		t.Fatal(err)
	}
	s.waitGone("orphan")
	s.waitProcessGone(pid)
}

// TestExecProbe: podsim does not run exec probes; the container counts as ready and the
// Ready condition says why.
func TestExecProbe(t *testing.T) {
	s := newSim(t, "a")
	s.start()
	pod := s.pod("exec")
	pod.Spec.Containers[0].ReadinessProbe.ProbeHandler = corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}
	s.create(pod)
	pod = s.waitPod("exec", "Ready", isReady)
	if msg := podCondition(pod, corev1.PodReady).Message; !strings.Contains(msg, "treated as ready") {
		t.Errorf("Ready message %q does not say the exec probe was not run", msg)
	}
}

// TestRunToCompletion: with restartPolicy Never a pod ends Succeeded or Failed by its
// exit code, and nothing restarts.
func TestRunToCompletion(t *testing.T) {
	s := newSim(t, "a")
	s.start()
	for name, code := range map[string]string{"succeeds": "0", "fails": "3"} {
		pod := s.pod(name, "-exit-now", "-exit-code="+code)
		pod.Spec.RestartPolicy = corev1.RestartPolicyNever
		pod.Spec.Containers[0].ReadinessProbe = nil
		s.create(pod)
	}
	for name, want := range map[string]corev1.PodPhase{"succeeds": corev1.PodSucceeded, "fails": corev1.PodFailed} {
		pod := s.waitPod(name, string(want), func(p *corev1.Pod) bool { return p.Status.Phase == want })
		cs := pod.Status.ContainerStatuses
		if len(cs) != 1 || cs[0].State.Terminated == nil || cs[0].RestartCount != 0 || isReady(pod) {
			t.Errorf("%s: %+v, ready %v", name, cs, isReady(pod))
		}
	}
}
