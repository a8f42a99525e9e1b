package podsim

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/crdipc/crdipc/internal/simnode"
)

// Image runs the containers of one image on a simulated node.
type Image interface {
	// Command returns the process for container c of pod p, not yet started. ip is the pod's
	// IP; env is the container's environment with every valueFrom resolved; dir is a
	// directory of the pod's own that outlives container restarts and restarts of up.
	//
	// c is a copy of the container whose command and args have had their $(VAR)
	// references expanded from env, as kubelet expands them, and whose volumeMounts are
	// those the process really gets, each at its mountPath in its mount namespace. The runtime sets the
	// process's stdout and stderr (appended to Root/<pod UID>/<container>.log) and puts
	// it in a process group of its own; when Cmd.Dir is empty it runs in dir, and when
	// Cmd.Env is nil it gets env plus HOSTNAME, HOME (dir) and up's PATH, unless env sets them.
	Command(p *corev1.Pod, c *corev1.Container, ip string, env map[string]string, dir string) (*Process, error)
}

// Process is a container's process, as an Image builds it.
type Process struct {
	Cmd *exec.Cmd
	// Forward maps a container port to the address the process really listens on when it
	// cannot listen on ip:port itself; the runtime forwards ip:port there (TCP).
	Forward map[int32]string
}

// Options configure the runtime of the simulated nodes.
type Options struct {
	Root   string           // per-pod directories: Root/<pod UID>/
	Images map[string]Image // by image repository without tag or digest, e.g. "bitcoin/bitcoin" (also match "docker.io/bitcoin/bitcoin" and "docker.io/library/..." normalisations)
	// NodeLabel selects simulated Nodes, as a label selector ("key=value", "key", …);
	// empty means simnode.Label + "=true" (label present with value "true").
	NodeLabel string

	// RestartBackoff is the delay before a failed container is restarted the first time;
	// it doubles with every further restart up to MaxRestartBackoff, as kubelet's
	// CrashLoopBackOff does. Defaults: 10 s and 5 min.
	RestartBackoff    time.Duration
	MaxRestartBackoff time.Duration
	// StopTimeout bounds how long stopping the manager waits for a pod's processes
	// after SIGTERM before it kills them; a pod's shorter terminationGracePeriodSeconds
	// wins. Default 10 s.
	StopTimeout time.Duration

	// CSI returns the Node service of the CSI driver CSIDriver on a node. With it, the
	// runtime mounts a pod's PersistentVolumeClaims whose PersistentVolume is a CSI volume
	// of CSIDriver, as kubelet does: NodeStageVolume once per node and volume,
	// NodePublishVolume per pod, and the reverse when the pods are done. Without it, a pod
	// with a PersistentVolumeClaim waits in ContainerCreating.
	CSI       func(node string) (csi.NodeClient, error)
	CSIDriver string

	// Kubelet, when set, returns what acts for one node, as its kubelet does: with the
	// node's own credentials (system:node:<name>), so that the Node authorizer and
	// NodeRestriction admission hold it to the pods bound to that node and what they
	// reference. Without it, every node acts with the manager's credentials.
	Kubelet func(node string) (Kubelet, error)
}

// Kubelet is what acts for one node.
type Kubelet struct {
	// Client writes the status of the node's pods, their final deletion and the status of
	// their claims, and reads the Secrets, ConfigMaps, claims and volumes they use. It
	// must not be cached: a kubelet may get those objects, not list or watch them.
	Client client.Client
	// Events records the Events of the node's pods.
	Events events.EventRecorder
}

const (
	defaultRestartBackoff    = 10 * time.Second
	defaultMaxRestartBackoff = 5 * time.Minute
	defaultStopTimeout       = 10 * time.Second
)

// Add adds the runtime (kubelet) controller of the simulated nodes to mgr, and a runnable
// that stops every process when mgr stops. It runs the pods bound to simulated nodes;
// binding them is kube-scheduler's job (the control plane's, as `crdipc up` runs it).
func Add(mgr manager.Manager, o Options) error {
	if o.Root == "" {
		return fmt.Errorf("podsim: a root directory is required")
	}
	root, err := filepath.Abs(o.Root)
	if err != nil {
		return fmt.Errorf("podsim: root %s: %w", o.Root, err)
	}
	o.Root = root
	if err := os.MkdirAll(o.Root, 0o755); err != nil {
		return fmt.Errorf("podsim: creating root: %w", err)
	}
	if o.NodeLabel == "" {
		o.NodeLabel = simnode.Label + "=true"
	}
	nodes, err := labels.Parse(o.NodeLabel)
	if err != nil {
		return fmt.Errorf("podsim: node label %q: %w", o.NodeLabel, err)
	}
	if o.RestartBackoff <= 0 {
		o.RestartBackoff = defaultRestartBackoff
	}
	if o.MaxRestartBackoff <= 0 {
		o.MaxRestartBackoff = defaultMaxRestartBackoff
	}
	if o.MaxRestartBackoff < o.RestartBackoff {
		o.MaxRestartBackoff = o.RestartBackoff
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = defaultStopTimeout
	}
	images := make(map[string]Image, len(o.Images))
	names := make([]string, 0, len(o.Images))
	for name, img := range o.Images {
		if img == nil {
			return fmt.Errorf("podsim: image %q has no implementation", name)
		}
		repo := repository(name)
		if repo == "" {
			return fmt.Errorf("podsim: invalid image name %q", name)
		}
		images[repo] = img
		names = append(names, name)
	}
	sort.Strings(names)

	if err := addIndexes(mgr); err != nil {
		return err
	}
	return addRuntime(mgr, o, nodes, images, names)
}

// repository is the normalised repository of an image reference, without tag or
// digest: "bitcoin/bitcoin:28" → "docker.io/bitcoin/bitcoin", "busybox" →
// "docker.io/library/busybox", "quay.io/x/y@sha256:…" → "quay.io/x/y".
func repository(ref string) string {
	ref = strings.TrimSpace(ref)
	if i := strings.IndexByte(ref, '@'); i >= 0 {
		ref = ref[:i]
	}
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		ref = ref[:i]
	}
	if ref == "" {
		return ""
	}
	domain, path, found := strings.Cut(ref, "/")
	if !found || (!strings.ContainsAny(domain, ".:") && domain != "localhost") {
		domain, path = "docker.io", ref
	}
	if domain == "index.docker.io" {
		domain = "docker.io"
	}
	if domain == "docker.io" && !strings.Contains(path, "/") {
		path = "library/" + path
	}
	return domain + "/" + path
}
