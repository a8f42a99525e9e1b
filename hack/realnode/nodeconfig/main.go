// Command nodeconfig writes the configuration of one real node of hack/realnode.sh
// (containerd, its CNI network, the kubelet, kube-proxy) and prints the address plan the
// script defaults to. The kubelet's and kube-proxy's files are marshalled from their typed
// configuration structs, so a misspelt or retired field does not compile.
//
//	go run ./hack/realnode/nodeconfig plan [--index N]
//	go run ./hack/realnode/nodeconfig write --dir DIR --node NAME --ca CA ... (see -h)
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"text/template"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	componentbase "k8s.io/component-base/config/v1alpha1"
	proxy "k8s.io/kube-proxy/config/v1alpha1"
	kubelet "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/crdipc/crdipc/internal/testenv/realnodeplan"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "nodeconfig:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: nodeconfig plan [--index N] | write --dir DIR ...")
	}
	switch args[0] {
	case "plan":
		return plan(args[1:])
	case "write":
		return write(args[1:])
	default:
		return fmt.Errorf("unknown command %q (plan, write)", args[0])
	}
}

// plan prints realnodeplan's flags for `hack/realnode.sh network`, or with --index for join.
func plan(args []string) error {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	index := fs.Int("index", 0, "the node's index (1-200); 0: the network's flags only")
	if err := fs.Parse(args); err != nil {
		return err
	}
	flags := realnodeplan.NetworkFlags()
	if *index != 0 {
		if *index < 1 || *index > realnodeplan.MaxIndex {
			return fmt.Errorf("--index %d: not 1-%d", *index, realnodeplan.MaxIndex)
		}
		flags = realnodeplan.NodeN(*index).AddressFlags()
	}
	fmt.Println(strings.Join(flags, " "))
	return nil
}

// node is what a node's configuration is written from.
type node struct {
	Dir, Name, CA, ProxyKubeconfig, CNIBin, PauseImage, CgroupRoot string
	IP                                                             netip.Addr
	Pods, Cluster, Services                                        netip.Prefix
}

func write(args []string) error {
	fs := flag.NewFlagSet("write", flag.ContinueOnError)
	var n node
	var nodeAddr, pods, cluster, services string
	fs.StringVar(&n.Dir, "dir", "", "the node's work directory (files are written there)")
	fs.StringVar(&n.Name, "node", "", "the node's name")
	fs.StringVar(&n.CA, "ca", "", "the CA the kubelet trusts for client certificates (the API server's)")
	fs.StringVar(&n.ProxyKubeconfig, "proxy-kubeconfig", "", "kube-proxy's kubeconfig")
	fs.StringVar(&n.CNIBin, "cni-bin", "/usr/lib/cni", "the CNI plugins' directory")
	fs.StringVar(&n.PauseImage, "pause-image", "", "the sandbox image")
	fs.StringVar(&n.CgroupRoot, "cgroup-root", "", "the kubelet's cgroupRoot")
	fs.StringVar(&nodeAddr, "node-address", "", "the node's address/prefix on the bridge")
	fs.StringVar(&pods, "pod-cidr", "", "the node's pod range")
	fs.StringVar(&cluster, "cluster-cidr", "", "every node's pods (routed, not masqueraded)")
	fs.StringVar(&services, "service-cidr", "", "the Service range")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for name, v := range map[string]string{"dir": n.Dir, "node": n.Name, "ca": n.CA,
		"proxy-kubeconfig": n.ProxyKubeconfig, "pause-image": n.PauseImage, "cgroup-root": n.CgroupRoot} {
		if v == "" {
			return fmt.Errorf("--%s is required", name)
		}
	}
	addr, err := netip.ParsePrefix(nodeAddr)
	if err != nil {
		return fmt.Errorf("--node-address: %w", err)
	}
	n.IP = addr.Addr()
	for _, p := range []struct {
		flag, value string
		into        *netip.Prefix
	}{{"pod-cidr", pods, &n.Pods}, {"cluster-cidr", cluster, &n.Cluster}, {"service-cidr", services, &n.Services}} {
		if *p.into, err = netip.ParsePrefix(p.value); err != nil {
			return fmt.Errorf("--%s: %w", p.flag, err)
		}
		if *p.into != p.into.Masked() {
			return fmt.Errorf("--%s %s: not a network address (%s)", p.flag, p.value, p.into.Masked())
		}
	}
	files := map[string]func(node) ([]byte, error){
		"containerd.toml":              containerdConfig,
		"cni/net.d/10-crdipc.conflist": cniConfig,
		"kubelet.yaml":                 kubeletConfig,
		"kube-proxy.yaml":              proxyConfig,
	}
	for name, render := range files {
		data, err := render(n)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		path := filepath.Join(n.Dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return err
		}
	}
	// host-local's allocations, next to the network config.
	return os.MkdirAll(filepath.Join(n.Dir, "cni", "ipam"), 0o755)
}

// containerdConfig: a containerd of the node's own, everything under its directory. No
// typed configuration here: containerd's would pull in its whole module.
var containerdTemplate = template.Must(template.New("containerd").Parse(`# Written by hack/realnode/nodeconfig: a containerd of its own, everything under {{.Dir}}.
version = 2
root = "{{.Dir}}/containerd/root"
state = "{{.Dir}}/containerd/state"
oom_score = 0

[grpc]
  address = "{{.Dir}}/containerd.sock"

[ttrpc]
  address = "{{.Dir}}/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{{.Dir}}/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{{.PauseImage}}"
  # Clamp containers' oom_score_adj to containerd's own: pause asks -998, which root without
  # CAP_SYS_RESOURCE (some CI VMs) may not set, and runc then fails every sandbox.
  restrict_oom_score_adj = true
  # Network namespaces under state, not /run/netns.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{{.Dir}}/runc"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{{.CNIBin}}"
    conf_dir = "{{.Dir}}/cni/net.d"
    max_conf_num = 1
`))

func containerdConfig(n node) ([]byte, error) {
	var b bytes.Buffer
	err := containerdTemplate.Execute(&b, n)
	return b.Bytes(), err
}

// cniConfig: the node's pods on its own bridge (in its namespace), the node their gateway;
// routes to the cluster's pods (other nodes' through the host) and Services only, no
// masquerading.
func cniConfig(n node) ([]byte, error) {
	type route struct {
		Dst string `json:"dst"`
	}
	type rng struct {
		Subnet  string `json:"subnet"`
		Gateway string `json:"gateway"`
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "crdipc",
		"plugins": []any{
			map[string]any{
				"type":             "bridge",
				"bridge":           "cni0",
				"isGateway":        true,
				"isDefaultGateway": false,
				"ipMasq":           false,
				"hairpinMode":      true,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": filepath.Join(n.Dir, "cni", "ipam"),
					"ranges":  [][]rng{{{Subnet: n.Pods.String(), Gateway: n.Pods.Addr().Next().String()}}},
					"routes":  []route{{Dst: n.Cluster.String()}, {Dst: n.Services.String()}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	return append(data, '\n'), err
}

func kubeletConfig(n node) ([]byte, error) {
	c := kubelet.KubeletConfiguration{
		TypeMeta: metav1.TypeMeta{APIVersion: "kubelet.config.k8s.io/v1beta1", Kind: "KubeletConfiguration"},
		// The API server reaches the kubelet on the node's InternalIP.
		Address:      n.IP.String(),
		ReadOnlyPort: 0,
		HealthzPort:  ptr[int32](0),
		Authentication: kubelet.KubeletAuthentication{
			Anonymous: kubelet.KubeletAnonymousAuthentication{Enabled: ptr(false)},
			Webhook:   kubelet.KubeletWebhookAuthentication{Enabled: ptr(true)},
			X509:      kubelet.KubeletX509Authentication{ClientCAFile: n.CA},
		},
		Authorization:            kubelet.KubeletAuthorization{Mode: kubelet.KubeletAuthorizationModeWebhook},
		ContainerRuntimeEndpoint: "unix://" + filepath.Join(n.Dir, "containerd.sock"),
		// Pods under a cgroup of this node's own: other kubelets run on this machine.
		CgroupRoot: n.CgroupRoot,
		// cgroup v1 hosts (CI VMs) are refused otherwise; containerd 1.6 cannot tell the
		// kubelet its driver (no RuntimeConfig RPC), so both say cgroupfs.
		FailCgroupV1: ptr(false),
		CgroupDriver: "cgroupfs",
		// Root may lack CAP_SYS_RESOURCE: the default -999 fails (non-fatal, but noisy).
		OOMScoreAdj:           ptr[int32](0),
		PodLogsDir:            filepath.Join(n.Dir, "pod-logs"),
		VolumePluginDir:       filepath.Join(n.Dir, "volume-plugins"),
		ResolverConfig:        ptr("/etc/resolv.conf"),
		ClusterDomain:         "cluster.local",
		FailSwapOn:            ptr(false),
		ProtectKernelDefaults: false,
		// A test machine's disk may be fuller than a production node's: evict only when
		// nearly full.
		MergeDefaultEvictionSettings: ptr(false),
		EvictionHard: map[string]string{
			"memory.available":   "100Mi",
			"nodefs.available":   "1%",
			"nodefs.inodesFree":  "1%",
			"imagefs.available":  "1%",
			"imagefs.inodesFree": "1%",
		},
		// Imported images cannot be pulled again: never collect them.
		ImageGCHighThresholdPercent: ptr[int32](100),
		ImageGCLowThresholdPercent:  ptr[int32](99),
		SerializeImagePulls:         ptr(false),
		RotateCertificates:          false,
		ServerTLSBootstrap:          false,
	}
	return marshal(c)
}

func proxyConfig(n node) ([]byte, error) {
	c := proxy.KubeProxyConfiguration{
		TypeMeta:         metav1.TypeMeta{APIVersion: "kubeproxy.config.k8s.io/v1alpha1", Kind: "KubeProxyConfiguration"},
		ClientConnection: componentbase.ClientConnectionConfiguration{Kubeconfig: n.ProxyKubeconfig},
		HostnameOverride: n.Name,
		BindAddress:      n.IP.String(),
		// The node's own loopback (its own network namespace).
		HealthzBindAddress: "127.0.0.1:10256",
		MetricsBindAddress: "127.0.0.1:10249",
		Mode:               proxy.ProxyMode("iptables"),
		ClusterCIDR:        n.Cluster.String(),
		// Traffic from this node's pods is local; the rest (other nodes, the host) is
		// masqueraded when a Service sends it on to another node, so that replies come back
		// the same way.
		DetectLocalMode:   proxy.LocalMode("BridgeInterface"),
		DetectLocal:       proxy.DetectLocalConfiguration{BridgeInterface: "cni0"},
		NodePortAddresses: []string{netip.PrefixFrom(n.IP, n.IP.BitLen()).String()},
		IPTables:          proxy.KubeProxyIPTablesConfiguration{LocalhostNodePorts: ptr(false)},
		OOMScoreAdj:       ptr[int32](0),
		// 0: leave conntrack's table size and timeouts as they are.
		Conntrack: proxy.KubeProxyConntrackConfiguration{
			MaxPerCore:            ptr[int32](0),
			Min:                   ptr[int32](0),
			TCPEstablishedTimeout: &metav1.Duration{},
			TCPCloseWaitTimeout:   &metav1.Duration{},
		},
	}
	return marshal(c)
}

// marshal writes what v sets: fields equal to their type's zero value are left out (the
// component defaults them as if absent), so the file reads like a hand-written one.
func marshal[T any](v T) ([]byte, error) {
	var zero T
	set, err := generic(v)
	if err != nil {
		return nil, err
	}
	unset, err := generic(zero)
	if err != nil {
		return nil, err
	}
	data, err := yaml.Marshal(prune(set, unset))
	if err != nil {
		return nil, err
	}
	return append([]byte("# Written by hack/realnode/nodeconfig.\n"), data...), nil
}

// generic is v as encoding/json decodes its JSON into an any.
func generic(v any) (any, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var g any
	err = json.Unmarshal(data, &g)
	return g, err
}

// prune drops from v's objects the members equal to zero's, and objects left empty.
func prune(v, zero any) any {
	m, ok := v.(map[string]any)
	if !ok {
		return v
	}
	z, _ := zero.(map[string]any)
	out := map[string]any{}
	for k, val := range m {
		zv, inZero := z[k]
		if inZero && reflect.DeepEqual(val, zv) {
			continue
		}
		if sub, ok := prune(val, zv).(map[string]any); ok && len(sub) == 0 && inZero {
			continue
		} else if ok {
			val = sub
		}
		out[k] = val
	}
	return out
}

func ptr[T any](v T) *T { return &v }
