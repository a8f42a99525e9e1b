package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/crdipc/crdipc/internal/cpushare"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/safefile"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/kubernetes/cmd/kube-controller-manager/names"
)

const (
	// serviceCIDR is the cluster's service range; only the apiserver's own
	// "kubernetes" Service takes an address from it.
	serviceCIDR = "10.96.0.0/24"
	serviceIP   = "10.96.0.1"
)

// DefaultControllers are the kube-controller-manager controllers crdipc's
// flows depend on: ownerReference cascades, namespace deletion, service
// account tokens for workloads, and PVC↔PV binding for the CSI flow. The
// two protection controllers remove the kubernetes.io/pvc-protection and
// pv-protection finalizers that admission adds: without them a deleted PVC
// stays Terminating and its PV is never released. The statefulset controller
// makes the Pods of the Bitcoin operator's StatefulSets (run by the simulated
// nodes' kubelet in `crdipc up`).
var DefaultControllers = []string{
	"garbage-collector-controller",
	"namespace-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"persistentvolume-binder-controller",
	"persistentvolumeclaim-protection-controller",
	"persistentvolume-protection-controller",
	"statefulset-controller",
	// Client certificates through CertificateSigningRequests (crdipc kubeconfig).
	names.CertificateSigningRequestSigningController,
	names.CertificateSigningRequestCleanerController,
}

// ClusterControllers are DefaultControllers and what real nodes and the workloads on them
// rely on (what `crdipc up` runs): Deployments, ReplicaSets and DaemonSets make their pods;
// node lifecycle turns a node whose kubelet stopped renewing its Lease Unknown, manages the
// not-ready and unreachable taints, and taint eviction moves pods off such a node; the
// attach/detach controller creates VolumeAttachments for CSI volumes of pods on nodes whose
// kubelet leaves attaching to it; kube-root-ca.crt, which every pod's service account
// token volume mounts, is published into each namespace; pods of deleted nodes and
// terminated pods are collected; the `kubernetes` Service and every other one get
// EndpointSlices for kube-proxy; finished Jobs are cleaned up after their TTL; disruption
// budgets say what a drain may evict; a pod's generic ephemeral volume
// (spec.volumes[].ephemeral) gets its claim. Tests that create bare Nodes with no kubelet
// behind them keep DefaultControllers: node lifecycle would taint those nodes Unknown.
var ClusterControllers = append(slices.Clone(DefaultControllers),
	names.DeploymentController,
	names.ReplicaSetController,
	names.DaemonSetController,
	names.JobController,
	names.NodeLifecycleController,
	names.TaintEvictionController,
	names.PersistentVolumeAttachDetachController,
	names.RootCACertificatePublisherController,
	names.PodGarbageCollectorController,
	names.EndpointsController,
	names.EndpointSliceController,
	names.EndpointSliceMirroringController,
	names.TTLAfterFinishedController,
	// PodDisruptionBudgets' status (how many pods may go): without it every budget allows
	// none, and an eviction — every pod of a kubectl drain — is refused forever.
	names.DisruptionController,
	names.EphemeralVolumeController,
)

// Config says where and how to run the control plane.
type Config struct {
	// DataDir holds etcd's data, the PKI, the kubeconfig and the logs. It is
	// durable: a control plane started again on it sees every object.
	DataDir string
	// Port is the API server's port on 127.0.0.1; 0 reuses the previous
	// run's port when it is free, so an exported KUBECONFIG stays valid,
	// and otherwise takes any free port.
	Port int
	// Controllers overrides DefaultControllers when non-nil.
	Controllers []string
	// Scheduler runs kube-scheduler, which binds every pod that names no node.
	Scheduler bool
	// AdvertiseAddress, when set, is an address of this machine the API server also serves
	// on (at the same port as on 127.0.0.1) and publishes as the endpoint of the
	// `kubernetes` Service, so that pods on real nodes reach it. Its serving certificate
	// names it.
	AdvertiseAddress net.IP
	// Progress, when set, is told about each startup step as it completes.
	Progress func(step string, took time.Duration)
	// CRDs installs crdipc's system namespace and CRDs (install.Apply) and waits until
	// they are served: what up, bench and the test harness all start with.
	CRDs bool
	// Install, when set, installs what else the caller needs in the cluster before Start
	// returns (identities, configuration). It runs after the CRDs, as cluster admin, while
	// the API server finishes the bootstrap of a first start, which it does not depend on.
	// issue is ClientConfig: credentials for whom the install grants less than admin.
	Install func(ctx context.Context, admin *rest.Config, issue func(user string, groups ...string) (*rest.Config, error)) error
	// TracerProvider, when set, records kube-apiserver's spans for the requests it
	// serves (see tracing.Provider.APIServer). kube-apiserver continues the trace of a
	// request's traceparent header. Nil: no spans, as kube-apiserver without a
	// tracing configuration.
	TracerProvider trace.TracerProvider
}

// ControlPlane is a running control plane.
type ControlPlane struct {
	// RESTConfig authenticates as a cluster admin (O=system:masters).
	RESTConfig *rest.Config
	// Kubeconfig is the path of a kubeconfig file for RESTConfig's identity.
	Kubeconfig string
	// URL is the API server's https address.
	URL string
	// AdvertiseURL is the API server's address for pods and nodes (Config.AdvertiseAddress),
	// empty without one.
	AdvertiseURL string

	dataDir string
	pki     pki
	lock    *os.File
	cancel  context.CancelFunc
	// controllers is the controller manager, stopped before the API server (Stop).
	controllers     *component
	stopControllers context.CancelFunc
	listener        *trackingListener
	components      []*component
	etcd            *etcdServer
	stopped         chan struct{}
	once            sync.Once
}

// ErrDataDirInUse is returned by Start when another process runs a control
// plane on the same data directory.
var ErrDataDirInUse = errors.New("data directory is in use by another crdipc control plane")

// Start runs etcd, kube-apiserver and the controllers and returns once the
// API server answers /readyz. Stop releases everything Start took.
func Start(ctx context.Context, cfg Config) (_ *ControlPlane, err error) {
	if cfg.DataDir == "" {
		return nil, errors.New("controlplane: DataDir is required")
	}
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("resolving data dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating data dir: %w", err)
	}
	// Every later path is the real one, not through a link someone could repoint.
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		return nil, fmt.Errorf("resolving data dir: %w", err)
	}
	if err := checkDataDir(dir); err != nil {
		return nil, err
	}
	progress := cfg.Progress
	if progress == nil {
		progress = func(string, time.Duration) {}
	}
	step := time.Now()
	done := func(name string) {
		progress(name, time.Since(step))
		step = time.Now()
	}

	lock, err := lockDataDir(dir)
	if err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	cp := &ControlPlane{dataDir: dir, pki: newPKI(filepath.Join(dir, "pki")), lock: lock, cancel: cancel, stopped: make(chan struct{})}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()

	if err := redirectLogs(filepath.Join(dir, "logs")); err != nil {
		return nil, err
	}
	var servingIPs []net.IP
	if cfg.AdvertiseAddress != nil {
		if cfg.AdvertiseAddress.IsLoopback() || cfg.AdvertiseAddress.IsUnspecified() {
			return nil, fmt.Errorf("advertise address %s: must be an address of this machine that pods can reach, not loopback or unspecified", cfg.AdvertiseAddress)
		}
		servingIPs = append(servingIPs, cfg.AdvertiseAddress)
	}
	if err := cp.pki.ensure(servingIPs...); err != nil {
		return nil, err
	}
	done("certificates")

	// Each component starts under its label, so that the process's CPU can be told apart by
	// component (cpushare): what they start in the background inherits it.
	cpushare.Do("etcd", func() {
		cp.etcd, err = startEtcd(ctx, filepath.Join(dir, "etcd"), filepath.Join(dir, "logs", "etcd.log"), cp.pki)
	})
	if err != nil {
		return nil, err
	}
	done("etcd")

	ln, err := listen(dir, cfg.Port)
	if err != nil {
		return nil, err
	}
	cp.URL = "https://" + ln.Addr().String()
	if cfg.AdvertiseAddress != nil {
		port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		adv, err := net.Listen("tcp", net.JoinHostPort(cfg.AdvertiseAddress.String(), port))
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("listening on the advertise address: %w", err)
		}
		cp.AdvertiseURL = "https://" + adv.Addr().String()
		ln = joinListeners(ln, adv)
	}
	cp.RESTConfig = &rest.Config{
		Host: cp.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAFile:   cp.pki.caCert,
			CertFile: cp.pki.adminCert,
			KeyFile:  cp.pki.adminKey,
		},
		// client-go's default of 5 QPS would make crdipc's own services the
		// bottleneck; the API server's priority and fairness protects it.
		QPS:   -1,
		Burst: 1000,
	}
	cp.Kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(cp.Kubeconfig, cp.URL, cp.pki.caCert, cp.pki.adminCert, cp.pki.adminKey, "crdipc-admin"); err != nil {
		return nil, err
	}
	controllerKubeconfig := filepath.Join(dir, "pki", "controller-manager.kubeconfig")
	if err := writeKubeconfig(controllerKubeconfig, cp.URL, cp.pki.caCert, cp.pki.controllerCert, cp.pki.controllerKey, "system:kube-controller-manager"); err != nil {
		return nil, err
	}
	schedulerKubeconfig := filepath.Join(dir, "pki", "scheduler.kubeconfig")
	if err := writeKubeconfig(schedulerKubeconfig, cp.URL, cp.pki.caCert, cp.pki.schedulerCert, cp.pki.schedulerKey, "system:kube-scheduler"); err != nil {
		return nil, err
	}

	cp.listener = newTrackingListener(ln)
	var api *component
	cpushare.Do("kube-apiserver", func() {
		api, err = startAPIServer(runCtx, cp.listener, cp.etcd.clientURL, cp.pki, cfg.AdvertiseAddress, cfg.TracerProvider)
	})
	if err != nil {
		return nil, err
	}
	cp.components = append(cp.components, api)
	client, err := kubernetes.NewForConfig(cp.RESTConfig)
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	// On a fresh data dir the API server serves a second or more before it is ready: its
	// post-start hooks write the default RBAC roles, priority classes and flow control
	// objects one by one. The CRDs need none of that (admin is system:masters), so they
	// are installed meanwhile, and readiness is awaited after.
	if err := waitReady(ctx, client, api, bootstrapHooks...); err != nil {
		return nil, err
	}
	done("kube-apiserver serving")

	// CRDs before the controllers: the garbage collector discovers the resources it
	// watches when it starts and only every 30 s after, so objects of a CRD installed
	// after it would wait that long for their owners' cascades.
	if cfg.CRDs {
		names, err := install.Apply(ctx, cp.RESTConfig)
		if err != nil {
			return nil, err
		}
		done(fmt.Sprintf("%d CRDs established", len(names)))
	}
	g, gctx := errgroup.WithContext(ctx)
	if cfg.Install != nil {
		g.Go(func() error { return cfg.Install(gctx, rest.CopyConfig(cp.RESTConfig), cp.ClientConfig) })
	}
	g.Go(func() error { return waitReady(gctx, client, api) })
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if cfg.Install != nil {
		done("kube-apiserver ready, installed")
	} else {
		done("kube-apiserver ready")
	}
	controllers := cfg.Controllers
	if controllers == nil {
		controllers = DefaultControllers
	}
	if len(controllers) > 0 {
		kcmCtx, stopKCM := context.WithCancel(runCtx)
		var kcm *component
		cpushare.Do("kube-controller-manager", func() {
			kcm, err = startControllerManager(kcmCtx, controllerKubeconfig, dir, cp.pki, controllers)
		})
		if err != nil {
			stopKCM()
			return nil, err
		}
		cp.components = append(cp.components, kcm)
		cp.controllers, cp.stopControllers = kcm, stopKCM
		done("controllers")
		// A newcomer's first `kubectl apply` of a pod comes the moment Start returns (up
		// prints the KUBECONFIG line then). Admission refuses a pod whose ServiceAccount does
		// not exist yet, and the kubelet cannot mount its token without kube-root-ca.crt;
		// both are made by controllers that have only just started.
		if err := waitWorkloadPrerequisites(ctx, client, kcm, controllers); err != nil {
			return nil, err
		}
		done("default service account")
	}
	if cfg.Scheduler {
		var sched *component
		cpushare.Do("kube-scheduler", func() {
			sched, err = startScheduler(runCtx, schedulerKubeconfig)
		})
		if err != nil {
			return nil, err
		}
		cp.components = append(cp.components, sched)
		done("scheduler")
	}
	return cp, nil
}

// component is one part of the control plane running in a goroutine.
type component struct {
	name string
	done chan struct{}
	err  error
}

func runComponent(name string, run func() error) *component {
	c := &component{name: name, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		if err := run(); err != nil && !errors.Is(err, context.Canceled) {
			c.err = fmt.Errorf("%s: %w", name, err)
		}
	}()
	return c
}

// DataDir is the absolute path of the control plane's data directory.
func (cp *ControlPlane) DataDir() string { return cp.dataDir }

// EtcdURL is etcd's client address (https; it admits only a certificate of etcd's CA).
func (cp *ControlPlane) EtcdURL() string { return cp.etcd.clientURL }

// controllersStopTimeout bounds how long Stop waits for the controller manager before it
// stops the API server anyway.
const controllersStopTimeout = 15 * time.Second

// Stop shuts every component down, waits for them and releases the data
// directory. It is safe to call more than once.
func (cp *ControlPlane) Stop() error {
	cp.once.Do(func() {
		if cp.controllers != nil {
			// The controllers first, while the API server still answers: a controller that
			// cannot reach it at a bad moment may end the process (the namespace controller
			// calls klog.FlushAndExit when its first discovery fails). The controller
			// manager waits for its controllers to return, up to its shutdown timeout.
			cp.stopControllers()
			select {
			case <-cp.controllers.done:
			case <-time.After(controllersStopTimeout):
			}
		}
		cp.cancel()
		// kube-apiserver drains requests before it returns, but waits up to
		// a minute for open watches; clients of a stopping process would see
		// their connections drop, so drop them after a short drain.
		drain := time.After(time.Second)
		for _, c := range cp.components {
			select {
			case <-c.done:
				continue
			case <-drain:
			}
			break
		}
		if cp.listener != nil {
			cp.listener.closeAll()
		}
		for _, c := range cp.components {
			<-c.done
		}
		if cp.etcd != nil {
			cp.etcd.close()
		}
		if cp.lock != nil {
			_ = syscall.Flock(int(cp.lock.Fd()), syscall.LOCK_UN)
			_ = cp.lock.Close()
		}
		close(cp.stopped)
	})
	var errs []error
	for _, c := range cp.components {
		errs = append(errs, c.err)
	}
	return errors.Join(errs...)
}

// lockDataDir takes an exclusive, non-blocking flock on the data directory.
// The kernel drops it when the process dies, so a crash never leaves a stale
// lock behind (unlike a PID file).
func lockDataDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, "lock")
	f, err := safefile.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := safefile.ReadFile(path)
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s (held by pid %s); stop it or pick another --data-dir", ErrDataDirInUse, dir, strings.TrimSpace(string(holder)))
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}

func writeKubeconfig(path, server, ca, cert, key, user string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["crdipc"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificate: cert, ClientKey: key}
	cfg.Contexts["crdipc"] = &clientcmdapi.Context{Cluster: "crdipc", AuthInfo: user}
	cfg.CurrentContext = "crdipc"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("writing kubeconfig: %w", err)
	}
	return safefile.Write(path, data, 0o600)
}

// bootstrapHooks are the API server's post-start hooks that write its default objects:
// the slow part of a first start, and nothing installing CRDs depends on.
var bootstrapHooks = []string{
	"poststarthook/" + hookBootstrapRoles,
	"poststarthook/" + hookBootstrapPriorityClasses,
	"poststarthook/priority-and-fairness-config-producer",
}

// waitReady polls /readyz. Polling is right here: there is nothing to watch
// before the API server serves.
//
// exclude names /readyz checks not to wait for.
// waitWorkloadPrerequisites waits until the objects that a pod in namespace default needs
// and that the given controllers make exist: the ServiceAccount default (serviceaccount
// controller) and the ConfigMap kube-root-ca.crt (root CA publisher).
func waitWorkloadPrerequisites(ctx context.Context, client kubernetes.Interface, kcm *component, controllers []string) error {
	var wants []func(context.Context) error
	if slices.Contains(controllers, names.ServiceAccountController) {
		wants = append(wants, func(ctx context.Context) error {
			_, err := client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
			return err
		})
	}
	if slices.Contains(controllers, names.RootCACertificatePublisherController) {
		wants = append(wants, func(ctx context.Context) error {
			_, err := client.CoreV1().ConfigMaps(metav1.NamespaceDefault).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
			return err
		})
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for _, want := range wants {
		for {
			err := want(ctx)
			if err == nil {
				break
			}
			select {
			case <-kcm.done:
				return fmt.Errorf("kube-controller-manager exited before it made the default service account: %w", kcm.err)
			case <-ctx.Done():
				return fmt.Errorf("waiting for namespace default's service account and root CA: %w (last error: %v)", ctx.Err(), err)
			case <-tick.C:
			}
		}
	}
	return nil
}

func waitReady(ctx context.Context, client kubernetes.Interface, api *component, exclude ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		var status int
		req := client.Discovery().RESTClient().Get().AbsPath("/readyz")
		for _, e := range exclude {
			req = req.Param("exclude", e)
		}
		res := req.Do(ctx).StatusCode(&status)
		if status == 200 {
			return nil
		}
		last = res.Error()
		select {
		case <-api.done:
			return fmt.Errorf("kube-apiserver exited before it was ready: %w", api.err)
		case <-ctx.Done():
			return fmt.Errorf("waiting for kube-apiserver /readyz: %w (last error: %v)", ctx.Err(), last)
		case <-tick.C:
		}
	}
}
