// Package testenv runs integration tests against the real control plane
// `crdipc up` runs: one embedded etcd + kube-apiserver + controllers per test
// package, started from TestMain, with crdipc's CRDs installed.
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
//	func TestX(t *testing.T) {
//		env := testenv.Get(t)
//		ns := env.Namespace(t)
//		...
//	}
package testenv

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/crdipc/crdipc/internal/controlplane"
	"github.com/crdipc/crdipc/internal/scheme"
)

// Env is a running control plane with clients for it.
type Env struct {
	// Config authenticates as cluster admin, unthrottled.
	Config *rest.Config
	// Client is a controller-runtime client (no cache) that knows every crdipc kind.
	Client client.WithWatch
	// Kube is a client-go clientset for built-in kinds.
	Kube kubernetes.Interface

	dir            string
	cp             *controlplane.ControlPlane
	tracerProvider trace.TracerProvider
}

var current atomic.Pointer[Env]

// Main starts the control plane, runs the package's tests, stops it and
// exits. Call it from TestMain.
func Main(m *testing.M, opts ...Option) {
	os.Exit(run(m, opts))
}

// Option changes the control plane Main starts.
type Option func(*Env)

// WithTracerProvider has kube-apiserver record its spans with tp, for tests of
// traces that cross it (see controlplane.Config.TracerProvider).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(e *Env) { e.tracerProvider = tp }
}

func run(m *testing.M, opts []Option) int {
	// Components under test log through controller-runtime; their logs are
	// noise unless a test is being debugged: CRDIPC_TEST_LOG=1 shows them.
	if os.Getenv("CRDIPC_TEST_LOG") != "" {
		ctrllog.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	} else {
		ctrllog.SetLogger(logr.Discard())
	}
	dir, err := os.MkdirTemp("", "crdipc-testenv-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	env := &Env{dir: dir}
	for _, opt := range opts {
		opt(env)
	}
	start := time.Now()
	if err := env.start(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "testenv: starting control plane:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "testenv: control plane ready in %v (data %s)\n", time.Since(start).Round(time.Millisecond), dir)
	current.Store(env)
	code := m.Run()
	current.Store(nil)
	if err := env.cp.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "testenv: stopping control plane:", err)
	}
	return code
}

func (e *Env) start(ctx context.Context) error {
	// kube-scheduler binds pods that name no node, as in `crdipc up`; the node-side
	// controllers (node lifecycle among them) stay off: tests create bare Nodes that no
	// kubelet or simulated node heartbeats for.
	cp, err := controlplane.Start(ctx, controlplane.Config{DataDir: e.dir, CRDs: true, Scheduler: true, TracerProvider: e.tracerProvider})
	if err != nil {
		return err
	}
	c, err := client.NewWithWatch(cp.RESTConfig, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		_ = cp.Stop()
		return fmt.Errorf("creating client: %w", err)
	}
	kube, err := kubernetes.NewForConfig(cp.RESTConfig)
	if err != nil {
		_ = cp.Stop()
		return fmt.Errorf("creating clientset: %w", err)
	}
	e.cp, e.Config, e.Client, e.Kube = cp, cp.RESTConfig, c, kube
	return nil
}

// Get returns the package's environment; the test fails if TestMain did
// not call Main.
func Get(t testing.TB) *Env {
	t.Helper()
	e := current.Load()
	if e == nil {
		t.Fatal("testenv: no control plane; call testenv.Main from TestMain")
	}
	return e
}

// Current returns the package's environment, or nil outside Main. Runnable
// examples, which get no *testing.T, use it.
func Current() *Env { return current.Load() }

// DataDir is the control plane's data directory.
func (e *Env) DataDir() string { return e.dir }

// Namespace creates a namespace for one test. It is deleted when the test
// ends, without waiting: namespace deletion takes the namespace controller
// several seconds, which tests should not pay one by one.
func (e *Env) Namespace(t testing.TB) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"}}
	if err := e.Client.Create(context.Background(), ns); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() {
		if os.Getenv("CRDIPC_KEEP_NAMESPACES") == "" {
			_ = e.Client.Delete(context.Background(), ns)
		}
	})
	return ns.Name
}

// Restart stops the control plane and starts it again on the same data
// directory and port, as a user restarting `crdipc up` would. Clients held
// by the test keep working once it returns.
func (e *Env) Restart(t testing.TB) {
	t.Helper()
	url := e.cp.URL
	if err := e.cp.Stop(); err != nil {
		t.Logf("testenv: stop: %v", err)
	}
	if err := e.start(context.Background()); err != nil {
		t.Fatalf("testenv: restart: %v", err)
	}
	if e.cp.URL != url {
		t.Fatalf("testenv: restarted control plane serves %s, not %s as before", e.cp.URL, url)
	}
}

// EtcdURL is the control plane's etcd client address, for tests of who may reach it.
func (e *Env) EtcdURL() string { return e.cp.EtcdURL() }
