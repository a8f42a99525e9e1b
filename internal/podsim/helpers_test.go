package podsim_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/internal/podsim"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// helperEnv makes the test binary a tiny server instead of running tests: the process
// the test images run.
const helperEnv = "PODSIM_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperMain())
	}
	testenv.Main(m)
}

// helperMain serves GET /info (its args, environment, working directory and pid) on
// -listen, appends "<container> <pid>" to $POD_DIR/starts, and exits as told.
func helperMain() int {
	fs := flag.NewFlagSet("helper", flag.ContinueOnError)
	listen := fs.String("listen", os.Getenv("HELPER_LISTEN"), "address to serve on")
	exitAfter := fs.Duration("exit-after", 0, "exit after this long")
	exitNow := fs.Bool("exit-now", false, "exit at once")
	exitCode := fs.Int("exit-code", 0, "exit code")
	ignoreTerm := fs.Bool("ignore-term", false, "ignore SIGTERM")
	fs.String("greeting", "", "recorded in args only")
	fs.String("literal", "", "recorded in args only")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	fmt.Printf("helper %s started: %q\n", os.Getenv("HELPER_CONTAINER"), os.Args[1:])
	if dir := os.Getenv("POD_DIR"); dir != "" {
		f, err := os.OpenFile(filepath.Join(dir, "starts"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Println(err)
			return 1
		}
		fmt.Fprintf(f, "%s %d\n", os.Getenv("HELPER_CONTAINER"), os.Getpid())
		f.Close()
	}
	if *ignoreTerm {
		signal.Ignore(syscall.SIGTERM)
	} else {
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		go func() {
			<-term
			fmt.Println("SIGTERM: exiting")
			os.Exit(0)
		}()
	}
	if *exitNow {
		return *exitCode
	}
	if *exitAfter > 0 {
		time.AfterFunc(*exitAfter, func() {
			fmt.Println("exiting with", *exitCode)
			os.Exit(*exitCode)
		})
	}
	if *listen == "" {
		select {}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	http.HandleFunc("/info", func(w http.ResponseWriter, _ *http.Request) {
		wd, _ := os.Getwd()
		env := map[string]string{}
		for _, kv := range os.Environ() {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		_ = json.NewEncoder(w).Encode(info{Args: os.Args[1:], Env: env, Dir: wd, PID: os.Getpid()})
	})
	fmt.Println(http.Serve(ln, nil))
	return 1
}

type info struct {
	Args []string          `json:"args"`
	Env  map[string]string `json:"env"`
	Dir  string            `json:"dir"`
	PID  int               `json:"pid"`
}

func getInfo(addr string) (*info, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/info")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var i info
	if err := json.NewDecoder(resp.Body).Decode(&i); err != nil {
		return nil, err
	}
	return &i, nil
}

// helperImage runs the test binary as the helper, with the container's command and args
// (already expanded) as its arguments.
type helperImage struct{}

func (helperImage) Command(p *corev1.Pod, c *corev1.Container, ip string, env map[string]string, dir string) (*podsim.Process, error) {
	return &podsim.Process{Cmd: helperCmd(c, env, dir)}, nil
}

func helperCmd(c *corev1.Container, env map[string]string, dir string, extra ...string) *exec.Cmd {
	self, err := os.Executable()
	if err != nil {
		self = os.Args[0]
	}
	cmd := exec.Command(self, append(append([]string(nil), c.Command...), c.Args...)...)
	cmd.Env = []string{helperEnv + "=1", "POD_DIR=" + dir, "HELPER_CONTAINER=" + c.Name}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, extra...)
	return cmd
}

// forwardImage runs the helper on 127.0.0.1:<some free port> and has the runtime forward
// the pod's port 8080 there, as an image whose program cannot listen on the pod IP would.
type forwardImage struct{}

func (forwardImage) Command(p *corev1.Pod, c *corev1.Container, ip string, env map[string]string, dir string) (*podsim.Process, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	return &podsim.Process{
		Cmd:     helperCmd(c, env, dir, "HELPER_LISTEN="+addr),
		Forward: map[int32]string{8080: addr},
	}, nil
}

const (
	helperImageName  = "podsim.test/helper:v1"
	forwardImageName = "podsim.test/forward:v1"
	clusterLabel     = "podsim.test/cluster"
)

var seq atomic.Int32

// sim is one test's world: a namespace, simulated nodes only its runtime selects, and
// that runtime.
type sim struct {
	t    *testing.T
	env  *testenv.Env
	c    client.Client
	ns   string
	id   string
	root string
	opts podsim.Options
	// as, when set, is whom the runtime's manager acts as; the admin otherwise.
	as *rest.Config
}

func newSim(t *testing.T, nodes ...string) *sim {
	t.Helper()
	env := testenv.Get(t)
	s := &sim{
		t: t, env: env, c: env.Client,
		id:   fmt.Sprintf("c%d", seq.Add(1)),
		root: t.TempDir(),
	}
	s.ns = env.Namespace(t)
	s.opts = podsim.Options{
		Root:           s.root,
		Images:         map[string]podsim.Image{"podsim.test/helper": helperImage{}, "podsim.test/forward": forwardImage{}},
		NodeLabel:      clusterLabel + "=" + s.id,
		RestartBackoff: time.Second,
		StopTimeout:    5 * time.Second,
	}
	for _, n := range nodes {
		s.addNode(n, nil)
	}
	// Pods need the namespace's default ServiceAccount (ServiceAccount admission).
	testenv.Eventually(t, 30*time.Second, "the default ServiceAccount", func(ctx context.Context) (bool, error) {
		err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: "default"}, &corev1.ServiceAccount{})
		return err == nil, err
	})
	return s
}

// node is the full name of one of this test's nodes.
func (s *sim) node(name string) string { return s.id + "-" + name }

// addNode adds a Ready node of this test, with the capacity a kubelet reports, on which
// the control plane's kube-scheduler may place pods.
func (s *sim) addNode(name string, labels map[string]string) *corev1.Node {
	s.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.node(name), Labels: map[string]string{clusterLabel: s.id}}}
	for k, v := range labels {
		n.Labels[k] = v
	}
	ctx := context.Background()
	if err := s.c.Create(ctx, n); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = s.c.Delete(context.Background(), n) })
	n.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Test",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
	}}
	// Without allocatable pods kube-scheduler finds the node full ("Too many pods").
	n.Status.Capacity = nodeCapacity()
	n.Status.Allocatable = nodeCapacity()
	if err := s.c.Status().Update(ctx, n); err != nil {
		s.t.Fatal(err)
	}
	testenv.LiftNotReadyTaint(s.t, s.c, n.Name)
	return n
}

// nodeCapacity is what a small node's kubelet reports as capacity and allocatable.
func nodeCapacity() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("4"),
		corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
}

// runtime is a running manager with podsim in it.
type runtime struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// start runs podsim (s.opts) in a manager of its own until stop or the end of the test;
// at the end, the test's pods are removed first.
func (s *sim) start() *runtime {
	s.t.Helper()
	cfg := s.env.Config
	if s.as != nil {
		cfg = s.as
	}
	mgr := testenv.NewManager(s.t, cfg)
	if err := podsim.Add(mgr, s.opts); err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rt := &runtime{cancel: cancel, done: make(chan error, 1)}
	go func() { rt.done <- mgr.Start(ctx) }()
	s.t.Cleanup(func() {
		// Force-delete the test's pods so that no other test's runtime sees them.
		ctx := context.Background()
		_ = s.c.DeleteAllOf(ctx, &corev1.Pod{}, client.InNamespace(s.ns), client.GracePeriodSeconds(0))
		testenv.Eventually(s.t, 30*time.Second, "the test's pods removed", func(ctx context.Context) (bool, error) {
			var pods corev1.PodList
			if err := s.c.List(ctx, &pods, client.InNamespace(s.ns)); err != nil {
				return false, err
			}
			if len(pods.Items) != 0 {
				names := make([]string, 0, len(pods.Items))
				for _, p := range pods.Items {
					names = append(names, p.Name)
				}
				return false, fmt.Errorf("pods left: %v", names)
			}
			return true, nil
		})
		s.stop(rt)
	})
	return rt
}

func (s *sim) stop(rt *runtime) {
	s.t.Helper()
	rt.once.Do(func() {
		rt.cancel()
		select {
		case err := <-rt.done:
			if err != nil {
				s.t.Errorf("manager: %v", err)
			}
		case <-time.After(30 * time.Second):
			s.t.Error("manager did not stop within 30s")
		}
	})
}

// pod is a pod of the helper image serving on $(POD_IP):8080 with a tcpSocket readiness
// probe on it.
func (s *sim) pod(name string, args ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: name, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			// kube-scheduler places pods on every node of the control plane: only this
			// test's nodes, which its runtime serves, will do.
			NodeSelector:                  map[string]string{clusterLabel: s.id},
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []corev1.Container{{
				Name:  "server",
				Image: helperImageName,
				Args:  append([]string{"-listen", "$(POD_IP):8080"}, args...),
				Env: []corev1.EnvVar{{
					Name:      "POD_IP",
					ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}},
				}},
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("http")}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
}

func (s *sim) create(obj client.Object) {
	s.t.Helper()
	if err := s.c.Create(context.Background(), obj); err != nil {
		s.t.Fatal(err)
	}
}

// waitPod waits up to 30 s until the pod satisfies cond and returns it; it fails with
// the pod's last state.
func (s *sim) waitPod(name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	s.t.Helper()
	return s.waitPodWithin(30*time.Second, name, what, cond)
}

// waitPodWithin is waitPod with another deadline.
func (s *sim) waitPodWithin(timeout time.Duration, name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	s.t.Helper()
	var pod corev1.Pod
	err := wait.Until(context.Background(), timeout, func(ctx context.Context) (bool, error) {
		if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: name}, &pod); err != nil {
			return false, err
		}
		if !cond(&pod) {
			return false, fmt.Errorf("phase %s", pod.Status.Phase)
		}
		return true, nil
	})
	if err != nil {
		b, _ := json.MarshalIndent(pod.Status, "", "  ")
		s.t.Fatalf("waiting for pod %s: %s: %v\nnode %q, status: %s\nlogs:\n%s", name, what, err, pod.Spec.NodeName, b, s.logs(&pod))
	}
	return &pod
}

// waitGone waits until the pod object is deleted.
func (s *sim) waitGone(name string) {
	s.t.Helper()
	testenv.Eventually(s.t, 30*time.Second, "pod "+name+" deleted", func(ctx context.Context) (bool, error) {
		var pod corev1.Pod
		err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: name}, &pod)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err == nil {
			err = fmt.Errorf("pod still there, phase %s, deletion requested %v", pod.Status.Phase, pod.DeletionTimestamp)
		}
		return false, err
	})
}

// logs are the pod's container logs, for failure messages.
func (s *sim) logs(pod *corev1.Pod) string {
	files, _ := filepath.Glob(filepath.Join(s.root, string(pod.UID), "*.log"))
	sort.Strings(files)
	var b strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(f)
		fmt.Fprintf(&b, "--- %s\n%s", filepath.Base(f), data)
	}
	return b.String()
}

func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podCondition(p *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// pidOf is the pid in a podsim container ID.
func pidOf(t *testing.T, cs corev1.ContainerStatus) int {
	t.Helper()
	var pid int
	if _, err := fmt.Sscanf(cs.ContainerID, "podsim://%d", &pid); err != nil {
		t.Fatalf("container ID %q: %v", cs.ContainerID, err)
	}
	return pid
}

// processGone: no process has that pid any more (the runtime reaped it).
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func (s *sim) waitProcessGone(pid int) {
	s.t.Helper()
	testenv.Eventually(s.t, 30*time.Second, fmt.Sprintf("process %d gone", pid), func(context.Context) (bool, error) {
		if !processGone(pid) {
			return false, errors.New("it still exists")
		}
		return true, nil
	})
}
