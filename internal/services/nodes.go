package services

import (
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/crdipc/crdipc/internal/bitcoin/btcd"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/nodeservice"
	"github.com/crdipc/crdipc/internal/podsim"
	"github.com/crdipc/crdipc/internal/podsim/busybox"
	"github.com/crdipc/crdipc/internal/simnode"
)

func nodesEntry() Entry {
	return Entry{
		Name:  "nodes",
		Short: "Run simulated nodes: Node objects, their pods as processes, their CSI node plugins",
		Long: `nodes plays what a cluster's nodes and their kubelets do, on this machine: it
creates --count Nodes (node-1 … node-N, label ` + simnode.Label + `=true) and
reports every Node with that label Ready while it runs (Ready=Unknown once it
stops); it runs the containers of the pods the cluster's kube-scheduler binds to
them as local processes, each pod on a loopback IP of its own, running the
images it can: bitcoin/bitcoin and btcsuite/btcd as
btcd (go install ` + btcd.Module + `), busybox as the host's sh and tools;
other images wait with reason ImageNotSimulated. It mounts a pod's
PersistentVolumeClaims of the CSI driver csi.crdipc.io as kubelet does, through
each node's CSI node plugin (NodeStage, then NodePublish), which it runs on
--csi-dir/nodes/<node>/csi.sock; a container with volumes runs in its own mount
namespace. This needs root (mounts, FUSE, loop devices). --root is the kubelets'
root directory: the node plugins stage and publish only inside it.

Credentials. In crdipc up, each node acts as its own kubelet would, as
system:node:<name> (group system:nodes, a client certificate up issues from the
cluster's CA at every start): it registers its own Node, reports its status,
renews its own Lease in kube-node-lease, writes its pods' status, Events and
final deletion, and reads the Secrets, ConfigMaps and claims its pods use, so
the Node authorizer and NodeRestriction admission keep it from any other node's
objects. Finding the labelled Nodes and watching their pods, which no single
kubelet may do, runs as the ServiceAccount crdipc-nodes, read-only
(config/rbac/nodes). Run on its own, it does all of that with the kubeconfig's
credentials. The CSI node plugins act with those of --csi-kubeconfig (default:
the same), as the node plugin's ServiceAccount (crdipc-csi-node, read-only)
would.
The pool agents of the nodes are a service of their own (crdipc pool-agent).`,
		Example: `  crdipc nodes --count 3 --root /var/lib/crdipc/pods --csi-dir /var/lib/crdipc/csi`,
		Kind:    Server,
		New: func() Service {
			return &nodesService{count: 3, root: "/var/lib/crdipc/pods", csiDir: "/var/lib/crdipc/csi"}
		},
	}
}

type nodesService struct {
	count                    int
	root, csiDir, csiKubecfg string
	csiExtraRoots            []string
	csi                      *nodeservice.Set
	kubelets                 *kubelets
}

func (s *nodesService) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&s.count, "count", s.count, "Nodes to create at start (node-1 … node-N) if missing; labelled Nodes created later are served too")
	fs.StringVar(&s.root, "root", s.root, "directory of the pods' files, one directory per pod, and the kubelets' root directory")
	fs.StringVar(&s.csiDir, "csi-dir", s.csiDir, "directory of the nodes' CSI sockets (nodes/<node>/csi.sock) and volume targets (targets/<node>)")
	fs.StringVar(&s.csiKubecfg, "csi-kubeconfig", "", "kubeconfig the CSI node plugins act with (default: --kubeconfig)")
	fs.StringSliceVar(&s.csiExtraRoots, "csi-extra-root", nil, "more directories the CSI node plugins stage and publish in besides --root (e.g. "+os.TempDir()+" for csi-sanity's default paths)")
}

func (s *nodesService) Setup(mgr manager.Manager, env Env) error {
	count, root, csiDir, extra := s.count, s.root, s.csiDir, s.csiExtraRoots
	csiCfg := env.Config
	var csiNodeCfg func(node string) (*rest.Config, error)
	var localReplicaSocket func(node string) string
	var err error
	switch {
	case env.Local != nil:
		count, root, csiDir = env.Local.Nodes, filepath.Join(env.Local.DataDir, "pods"), filepath.Join(env.Local.DataDir, "csi")
		// A development cluster on this machine: the CSI sanity suite's default paths
		// ($TMPDIR/csi-mount, $TMPDIR/csi-staging) work against up's socket as they are.
		extra = []string{os.TempDir()}
		// Each node's plugin reaches the replica on its node as on a real node: over the
		// socket of the node's pool agent (up runs one per node, pool-agent).
		localReplicaSocket = func(node string) string { return LocalReplicaSocket(env.Local.DataDir, node) }
		if csiCfg, err = env.Local.Config("csi-node"); err != nil {
			return err
		}
		if env.Local.NodeConfig != nil {
			// Each node's plugin requests its data-path certificate with a token bound to
			// its node, as a DaemonSet pod's token is: the operator approves nothing else.
			csiNodeCfg = func(node string) (*rest.Config, error) { return env.Local.NodeConfig("csi-node", node) }
		}
	case s.csiKubecfg != "":
		if csiCfg, err = (&ClusterFlags{Kubeconfig: s.csiKubecfg}).Config(); err != nil {
			return err
		}
	}
	if err := Absolute(&root); err != nil {
		return err
	}
	var asNode func(string) (client.Client, error)
	var asKubelet func(string) (podsim.Kubelet, error)
	if env.Local != nil && env.Local.KubeletConfig != nil {
		s.kubelets = newKubelets(env.Local.KubeletConfig, mgr.GetScheme(), mgr.GetRESTMapper())
		asNode, asKubelet = s.kubelets.client, s.kubelets.kubelet
	}
	if err := simnode.Add(mgr, simnode.Options{Nodes: count, Kubelet: asNode}); err != nil {
		return err
	}
	if s.csi, err = nodeservice.New(nodeservice.Options{Config: rest.CopyConfig(csiCfg), NodeConfig: csiNodeCfg, Dir: csiDir, KubeletRoot: root, ExtraRoots: extra, LocalReplicaSocket: localReplicaSocket}); err != nil {
		return err
	}
	// Every node's plugin serves from the start, as a DaemonSet's pod would, not only once
	// a pod of the node mounts a volume: CSI tools can dial it.
	for i := 1; i <= count; i++ {
		if _, err := s.csi.Client(simnode.NodeName(i)); err != nil {
			return err
		}
	}
	btcdImage := btcd.Image{}
	// Ctrl-C must end up within seconds: processes get 2 s after SIGTERM.
	if err := podsim.Add(mgr, podsim.Options{
		Root:        root,
		Images:      map[string]podsim.Image{"bitcoin/bitcoin": btcdImage, btcd.NativeImageName: btcd.NativeImage{}, busybox.Name: busybox.Image{}},
		StopTimeout: 2 * time.Second,
		CSI:         s.csi.Client,
		CSIDriver:   driver.Name,
		Kubelet:     asKubelet,
	}); err != nil {
		return err
	}
	note := "bitcoin/bitcoin and btcsuite/btcd run as btcd"
	if _, err := btcdImage.Find(); err != nil {
		note = "bitcoin/bitcoin and btcsuite/btcd cannot run: btcd is not installed (go install " + btcd.Module + ")"
	}
	env.say("csi      node plugins on %s", filepath.Join(csiDir, "nodes", "<node>", "csi.sock"))
	env.say("pods     run on the %d simulated nodes (label a Node %s=true to add one) under %s; %s; busybox runs the host's sh and tools", count, simnode.Label, root, note)
	return nil
}

// Stop stops the CSI node plugins, after the manager (the kubelet) unstaged every volume
// through them.
func (s *nodesService) Stop() {
	if s.csi != nil {
		s.csi.Stop()
	}
	if s.kubelets != nil {
		s.kubelets.stop()
	}
}
