package registration_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/record"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	kubeletcsi "k8s.io/kubernetes/pkg/volume/csi"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/registration"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// The kubelet in these tests is the kubelet's own plugin manager
// (k8s.io/kubernetes/pkg/kubelet/pluginmanager): its fsnotify watcher of the registration
// directory, its reconciler, and its registration operation, which calls GetInfo, hands the
// answer to the handler of the plugin's type and reports back with NotifyRegistrationStatus.
// Only the CSI plugin type's handler is the test's (kubeletHandler): the kubelet's own
// (k8s.io/kubernetes/pkg/volume/csi) would write the Node and CSINode objects.

const timeout = 30 * time.Second

// kubeletHandler is the kubelet's side of CSIPlugin sockets. It validates with the kubelet's
// own CSI check (the versions offered), unless refuse is set, and registers as the
// kubelet's CSI handler starts to: it calls NodeGetInfo at the endpoint it was given.
type kubeletHandler struct {
	refuse error

	mu    sync.Mutex
	calls []string
}

func (h *kubeletHandler) record(call string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, call)
}

// Calls are the plugin manager's calls so far: "validate <name> <endpoint>",
// "register <name> <endpoint> node=<node id>", "deregister <name> <endpoint>".
func (h *kubeletHandler) Calls() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.calls)
}

func (h *kubeletHandler) ValidatePlugin(ctx context.Context, name, endpoint string, versions []string) error {
	h.record(fmt.Sprintf("validate %s %s", name, endpoint))
	if h.refuse != nil {
		return h.refuse
	}
	return kubeletcsi.PluginHandler.ValidatePlugin(ctx, name, endpoint, versions)
}

func (h *kubeletHandler) RegisterPlugin(ctx context.Context, name, endpoint string, _ []string, _ *time.Duration) error {
	// The kubelet dials the endpoint as a plain Unix socket path.
	conn, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority("localhost"))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	info, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		h.record(fmt.Sprintf("register %s %s failed: %v", name, endpoint, err))
		return err
	}
	h.record(fmt.Sprintf("register %s %s node=%s", name, endpoint, info.GetNodeId()))
	return nil
}

func (h *kubeletHandler) DeRegisterPlugin(_ context.Context, name, endpoint string) {
	h.record(fmt.Sprintf("deregister %s %s", name, endpoint))
}

// startKubelet runs the kubelet's plugin manager on dir with h for CSI plugins, until the
// returned stop is called or the test ends.
func startKubelet(t *testing.T, dir string, h *kubeletHandler) (stop func()) {
	t.Helper()
	pm := pluginmanager.NewPluginManager(dir, &record.FakeRecorder{})
	pm.AddHandler(registerapi.CSIPlugin, h)
	ctx, cancel := context.WithCancel(context.Background())
	stopCh := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		pm.Run(ctx, kubeletconfig.NewSourcesReady(func(sets.Set[string]) bool { return true }), stopCh)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(stopCh); cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// node is a node's directories: the kubelet's registration directory and the one the CSI
// socket is in. Short, under os.TempDir: a Unix socket's path has at most 107 bytes.
type node struct{ registry, csiSock string }

func newNode(t *testing.T) node {
	t.Helper()
	dir, err := os.MkdirTemp("", "reg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	n := node{registry: filepath.Join(dir, "plugins_registry"), csiSock: filepath.Join(dir, "csi", "csi.sock")}
	if err := os.Mkdir(n.registry, 0o750); err != nil {
		t.Fatal(err)
	}
	return n
}

// serveDriver runs crdipc's CSI driver as node nodeID on n's CSI socket, with a fake API
// server (nothing here reaches it), until the test ends.
func serveDriver(t *testing.T, n node, nodeID string) {
	t.Helper()
	d, err := driver.New(driver.Options{
		Client:     fake.NewClientBuilder().WithScheme(scheme.Scheme).Build(),
		Registerer: prometheus.NewRegistry(),
		NodeID:     nodeID,
		TargetDir:  filepath.Join(filepath.Dir(n.csiSock), "targets"),
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "csi driver", func(ctx context.Context) error { return d.Serve(ctx, n.csiSock) })
}

// newServer returns the registration server of n's driver, reporting the CSI socket's path
// to the kubelet (here the host's path and the container's are the same).
func newServer(t *testing.T, n node) *registration.Server {
	t.Helper()
	s, err := registration.New(registration.Options{Dir: n.registry, Name: driver.Name, Endpoint: n.csiSock, CSIEndpoint: "unix://" + n.csiSock})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// awaitCalls waits until the kubelet handler's calls after the first since end with want.
func awaitCalls(t *testing.T, h *kubeletHandler, since int, what string, want ...string) {
	t.Helper()
	wait.Eventually(t, timeout, what, func(context.Context) (bool, error) {
		got := h.Calls()[since:]
		if len(got) < len(want) || !slices.Equal(got[len(got)-len(want):], want) {
			return false, fmt.Errorf("the kubelet's calls are %q, want them to end with %q", got, want)
		}
		return true, nil
	})
}

// awaitStatus waits until the kubelet has notified s that it registered the driver (or,
// with registered false, that it refused it).
func awaitStatus(t *testing.T, s *registration.Server, registered bool) registration.Status {
	t.Helper()
	var st registration.Status
	wait.Eventually(t, timeout, "the kubelet's NotifyRegistrationStatus", func(context.Context) (bool, error) {
		st = s.Status()
		if st.At.IsZero() || st.Registered != registered {
			return false, fmt.Errorf("status %+v, want registered=%t", st, registered)
		}
		return true, nil
	})
	return st
}

// healthz is what s.Healthz, wrapped around a handler that answers "next", answers path.
func healthz(s *registration.Server, path string) (int, string) {
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "next") })
	rec := httptest.NewRecorder()
	s.Healthz(next).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, strings.TrimSpace(rec.Body.String())
}

// TestKubeletRegistersDriver: the kubelet's plugin manager finds the registration socket,
// accepts the driver's name and versions, registers it at its CSI socket (where the
// driver answers NodeGetInfo as its node), and tells the server so; stopping the server
// removes the socket and the kubelet deregisters the driver.
func TestKubeletRegistersDriver(t *testing.T) {
	n := newNode(t)
	h := &kubeletHandler{}
	startKubelet(t, n.registry, h)
	serveDriver(t, n, "node-a")
	s := newServer(t, n)
	if want := filepath.Join(n.registry, "csi.crdipc.io-reg.sock"); s.SocketPath() != want {
		t.Fatalf("socket %s, want %s", s.SocketPath(), want)
	}
	stop := testenv.Start(t, "registration", s.Start)

	awaitCalls(t, h, 0, "registration with the kubelet",
		"validate csi.crdipc.io "+n.csiSock,
		"register csi.crdipc.io "+n.csiSock+" node=node-a")
	awaitStatus(t, s, true)
	if err := s.Check(); err != nil {
		t.Errorf("Check after the kubelet registered the driver: %v", err)
	}
	if code, body := healthz(s, "/healthz"); code != http.StatusOK || body != "next" {
		t.Errorf("/healthz: %d %q, want the driver's own answer", code, body)
	}

	calls := len(h.Calls())
	stop()
	if _, err := os.Lstat(s.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after the server stopped, its socket: %v, want it gone", err)
	}
	awaitCalls(t, h, calls, "deregistration once the socket is gone", "deregister csi.crdipc.io "+n.csiSock)
	if err := s.Check(); err != nil {
		t.Errorf("Check after a clean stop: %v", err)
	}
}

// TestKubeletRefusesDriver: when the kubelet refuses the driver, the server hears why and
// its health check fails, so that the liveness probe restarts the container.
func TestKubeletRefusesDriver(t *testing.T) {
	n := newNode(t)
	h := &kubeletHandler{refuse: errors.New("driver csi.crdipc.io is not welcome on this node")}
	startKubelet(t, n.registry, h)
	serveDriver(t, n, "node-a")
	s := newServer(t, n)
	testenv.Start(t, "registration", s.Start)

	st := awaitStatus(t, s, false)
	if !strings.Contains(st.Error, "is not welcome on this node") {
		t.Errorf("the kubelet's error %q does not give the handler's reason", st.Error)
	}
	if err := s.Check(); err == nil || !strings.Contains(err.Error(), "is not welcome on this node") {
		t.Errorf("Check after a refusal: %v, want the kubelet's reason", err)
	}
	if code, body := healthz(s, "/healthz"); code != http.StatusInternalServerError || !strings.Contains(body, "refused") {
		t.Errorf("/healthz after a refusal: %d %q, want 500 saying why", code, body)
	}
	if code, body := healthz(s, "/readyz"); code != http.StatusOK || body != "next" {
		t.Errorf("/readyz after a refusal: %d %q, want the driver's own answer", code, body)
	}
	for _, c := range h.Calls() {
		if strings.HasPrefix(c, "register ") {
			t.Errorf("the kubelet registered a driver it refused: %q", c)
		}
	}
}

// TestRestart: a node plugin killed without cleaning up leaves its registration socket
// behind; the next run replaces it and the kubelet registers the driver again. A kubelet
// started later (a kubelet restart) finds the socket that is there and registers the driver
// too. And a socket removed under a running server makes its health check fail.
func TestRestart(t *testing.T) {
	n := newNode(t)
	h := &kubeletHandler{}
	stopKubelet := startKubelet(t, n.registry, h)
	serveDriver(t, n, "node-a")
	first := newServer(t, n)
	stopFirst := testenv.Start(t, "first registration", first.Start)
	awaitStatus(t, first, true)
	registered := "register csi.crdipc.io " + n.csiSock + " node=node-a"
	awaitCalls(t, h, 0, "the first run's registration", registered)
	calls := len(h.Calls())
	stopFirst()

	// What a killed process leaves: a socket file nothing listens on.
	l, err := net.Listen("unix", first.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()

	second := newServer(t, n)
	testenv.Start(t, "second registration", second.Start)
	awaitStatus(t, second, true)
	awaitCalls(t, h, calls, "the second run's registration", registered)

	// The kubelet restarts: a new plugin manager finds the socket already there.
	stopKubelet()
	h2 := &kubeletHandler{}
	startKubelet(t, n.registry, h2)
	awaitCalls(t, h2, 0, "registration with a restarted kubelet", "validate csi.crdipc.io "+n.csiSock, registered)
	if err := second.Check(); err != nil {
		t.Errorf("Check while registered: %v", err)
	}

	// Someone empties the kubelet's registration directory.
	calls = len(h2.Calls())
	if err := os.Remove(second.SocketPath()); err != nil {
		t.Fatal(err)
	}
	if err := second.Check(); err == nil || !strings.Contains(err.Error(), "was removed") {
		t.Errorf("Check with the registration socket removed: %v, want an error", err)
	}
	awaitCalls(t, h2, calls, "deregistration once the socket is gone", "deregister csi.crdipc.io "+n.csiSock)
}

// TestWaitsForDriver: the kubelet is not offered the driver before its CSI socket answers
// (the kubelet calls NodeGetInfo at once), nor offered a socket that answers for another
// driver.
func TestWaitsForDriver(t *testing.T) {
	n := newNode(t)
	h := &kubeletHandler{}
	startKubelet(t, n.registry, h)
	// Something that accepts connections at the CSI socket but does not answer yet: a
	// driver still starting.
	if err := os.MkdirAll(filepath.Dir(n.csiSock), 0o750); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", n.csiSock)
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(t, n)
	testenv.Start(t, "registration", s.Start)
	if err := l.(*net.UnixListener).SetDeadline(time.Now().Add(timeout)); err != nil {
		t.Fatal(err)
	}
	conn, err := l.Accept()
	if err != nil {
		t.Fatalf("the server did not call the CSI socket before registering: %v", err)
	}
	if _, err := os.Lstat(s.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("registration socket while the driver does not answer yet: %v, want none", err)
	}
	conn.Close()
	l.Close()

	serveDriver(t, n, "node-a")
	awaitStatus(t, s, true)
	awaitCalls(t, h, 0, "registration once the driver answers",
		"validate csi.crdipc.io "+n.csiSock,
		"register csi.crdipc.io "+n.csiSock+" node=node-a")

	other, err := registration.New(registration.Options{Dir: n.registry, Name: "other.example.com", Endpoint: n.csiSock, CSIEndpoint: n.csiSock})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := other.Start(ctx); err == nil || !strings.Contains(err.Error(), `is "csi.crdipc.io", not "other.example.com"`) {
		t.Errorf("Start of a server for another driver: %v, want the names told apart", err)
	}
	if _, err := os.Lstat(other.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("registration socket of a server for another driver: %v, want none", err)
	}
}
