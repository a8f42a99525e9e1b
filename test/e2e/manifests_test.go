package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/crdipc/crdipc/config/crd"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/storage/agent"
)

// TestManifests checks that the manifests shipped for a real cluster (config/storage,
// config/csi, config/bitcoin, config/scm, and config/default, which is all of them) are valid:
// a server-side dry run has the API server of `crdipc up` decode, default, validate (strict:
// unknown or duplicate fields fail) and admit every object, against the real schemas, without
// storing anything. It also runs the commands that fill in and apply the VolumeAttachment
// sample template.
func TestManifests(t *testing.T) {
	requireKubectl(t)
	up := startUp(t, t.TempDir())

	for _, dir := range []string{"storage", "csi", "books", "bitcoin"} {
		t.Run("config/"+dir, func(t *testing.T) {
			path := filepath.Join("../../config", dir)
			objects := decodeDocuments(t, path, []byte(up.Kubectl(t, "kustomize", path)))
			args := []string{"apply", "--dry-run=server", "--validate=strict", "-k", path}
			out, err := up.Run("kubectl", args...)
			checkDryRun(t, args, out, err, len(objects))
		})
	}

	t.Run("config/scm", func(t *testing.T) {
		const dir = "../../config/scm"
		// The kustomization must build, though it cannot be applied as a whole here.
		up.Kubectl(t, "kustomize", dir)
		files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var (
			args        []string
			objects     int
			services    []corev1.Service
			monitors    []serviceMonitor
			scrapeFiles int
		)
		for _, file := range files {
			body, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			docs := decodeDocuments(t, file, body)
			switch kinds := documentKinds(docs); {
			case slices.Equal(kinds, []string{"Kustomization"}):
				// built above
			case slices.Equal(kinds, []string{""}):
				// Not for the API server: prometheus.yml's scrape_configs, for a Prometheus
				// without the Operator. (Debian's promtool lacks kubernetes_sd_configs, so
				// it cannot check this file.)
				var cfg struct {
					ScrapeConfigs []struct {
						JobName string `json:"job_name"`
					} `json:"scrape_configs"`
				}
				if err := yaml.Unmarshal(docs[0], &cfg); err != nil {
					t.Errorf("%s: %v", file, err)
				}
				if len(cfg.ScrapeConfigs) == 0 || cfg.ScrapeConfigs[0].JobName == "" {
					t.Errorf("%s: neither a Kubernetes object nor a Prometheus scrape configuration", file)
				}
				scrapeFiles++
			case slices.Contains(kinds, "ServiceMonitor"):
				// Its CRD (monitoring.coreos.com, the Prometheus Operator's) is not installed
				// in up, so the API server cannot check it: decode it and check that it
				// selects the Services below by their port names.
				for _, d := range docs {
					var m serviceMonitor
					if err := yaml.Unmarshal(d, &m); err != nil {
						t.Fatalf("%s: %v", file, err)
					}
					if m.APIVersion != "monitoring.coreos.com/v1" || m.Kind != "ServiceMonitor" {
						t.Errorf("%s: %s %s next to a ServiceMonitor: keep it in a file of its own", file, m.APIVersion, m.Kind)
					}
					monitors = append(monitors, m)
				}
			default:
				args = append(args, "-f", file)
				objects += len(docs)
				for _, d := range docs {
					var s corev1.Service
					if err := yaml.Unmarshal(d, &s); err == nil && s.Kind == "Service" {
						services = append(services, s)
					}
				}
			}
		}
		if len(monitors) == 0 || scrapeFiles == 0 || objects == 0 {
			t.Fatalf("config/scm: %d ServiceMonitors, %d scrape configurations, %d objects: want each", len(monitors), scrapeFiles, objects)
		}
		// The objects go into the namespace crdipc-scm, which namespace.yaml creates. A dry
		// run creates nothing, so the namespace must exist for real first: admission
		// refuses objects in a namespace that does not.
		up.Kubectl(t, "apply", "--validate=strict", "-f", filepath.Join(dir, "namespace.yaml"))
		args = append([]string{"apply", "--dry-run=server", "--validate=strict"}, args...)
		out, err := up.Run("kubectl", args...)
		checkDryRun(t, args, out, err, objects)
		for _, m := range monitors {
			checkServiceMonitor(t, m, services)
		}
	})

	// Everything in one apply, as docs/deploy.md says: kubectl apply -k config/default.
	// Its CRDs and the objects of the services go in one dry run; here up has installed the
	// CRDs already, so theirs is an update. The real apply works in one go on a fresh cluster
	// too: config/default holds no custom resources (which cannot be created, or dry-run,
	// before their CRD is established); config/scm's ServiceMonitor, the one custom resource
	// of the per-system directories, is left out of it (checkDefault checks both).
	t.Run("config/default", func(t *testing.T) {
		const dir = "../../config/default"
		objects := decodeDocuments(t, dir, []byte(up.Kubectl(t, "kustomize", dir)))
		checkDefault(t, objects)
		// A dry run creates nothing, and admission refuses objects in a namespace that does
		// not exist: crdipc-system does (up creates it), crdipc-scm is created for real.
		up.Kubectl(t, "apply", "--validate=strict", "-f", "../../config/scm/namespace.yaml")
		args := []string{"apply", "--dry-run=server", "--validate=strict", "-k", dir}
		out, err := up.Run("kubectl", args...)
		checkDryRun(t, args, out, err, len(objects))
		// docs/deploy.md's harness applies it server-side onto up, which has applied the
		// CRDs and the identity objects under field managers of its own: every object
		// both apply must agree, or the apply stops on a conflict (no --force-conflicts).
		args = []string{"apply", "--server-side", "--dry-run=server", "--validate=strict", "-k", dir}
		out, err = up.Run("kubectl", args...)
		checkDryRun(t, args, out, err, len(objects))
	})

	// An upgrade overlay (config/upgrade/from-<version>) is config/default with some
	// DaemonSets updated only on delete, and nothing else changed: what it applies first is
	// what config/default then applies again without restarting a pod.
	t.Run("config/upgrade", func(t *testing.T) {
		dirs, err := filepath.Glob("../../config/upgrade/from-*")
		if err != nil || len(dirs) == 0 {
			t.Fatalf("no config/upgrade/from-* overlay (%v)", err)
		}
		def := decodeDocuments(t, "config/default", []byte(up.Kubectl(t, "kustomize", "../../config/default")))
		for _, dir := range dirs {
			docs := decodeDocuments(t, dir, []byte(up.Kubectl(t, "kustomize", dir)))
			if len(docs) != len(def) {
				t.Fatalf("%s: %d objects, config/default %d", dir, len(docs), len(def))
			}
			var onDelete []string
			for i := range docs {
				var got, want map[string]any
				if err := yaml.Unmarshal(docs[i], &got); err != nil {
					t.Fatal(err)
				}
				if err := yaml.Unmarshal(def[i], &want); err != nil {
					t.Fatal(err)
				}
				if got["kind"] == "DaemonSet" {
					spec, _ := got["spec"].(map[string]any)
					if s, _ := spec["updateStrategy"].(map[string]any); s["type"] == "OnDelete" {
						onDelete = append(onDelete, got["metadata"].(map[string]any)["name"].(string))
						delete(spec, "updateStrategy")
						delete(want["spec"].(map[string]any), "updateStrategy")
					}
				}
				if !bytes.Equal(mustJSON(t, got), mustJSON(t, want)) {
					t.Errorf("%s: object %d differs from config/default's:\n%s\n%s", dir, i, docs[i], def[i])
				}
			}
			slices.Sort(onDelete)
			if want := []string{"crdipc-csi-node", "crdipc-fd-holder", "crdipc-pool-agent"}; !slices.Equal(onDelete, want) {
				t.Errorf("%s: DaemonSets updated on delete %v, want %v", dir, onDelete, want)
			}
		}
	})

	// The VolumeAttachment sample needs the name of a provisioned PV, so it is a template
	// whose comment gives the commands that fill it in and apply it: run them as written,
	// from the repository root, after provisioning the claim they name.
	t.Run("config/samples/csi/attach", func(t *testing.T) {
		const file = "../../config/samples/csi/attach/volumeattachment.yaml.tmpl"
		body, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var commands []string
		for line := range strings.Lines(string(body)) {
			c, ok := strings.CutPrefix(strings.TrimSpace(line), "#   ")
			if ok && (strings.HasPrefix(c, "kubectl ") || strings.HasPrefix(c, "sed ")) {
				commands = append(commands, c)
			}
		}
		if len(commands) != 2 {
			t.Fatalf("%s: %d commands in its comment (want kubectl wait, then sed | kubectl apply): %q", file, len(commands), commands)
		}
		up.Kubectl(t, "apply", "--validate=strict",
			"-f", "../../config/samples/csi/storage_v1alpha1_storagepoolclaim.yaml",
			"-f", "../../config/samples/csi/pvc.yaml")
		for _, c := range commands {
			out, err := up.RunIn("../..", "sh", "-c", c)
			if err != nil {
				t.Fatalf("%s: %v\n%s", c, err, out)
			}
			t.Logf("%s:\n%s", c, out)
		}
		up.Kubectl(t, "wait", "--for=jsonpath={.status.attached}=true", "volumeattachment/data-node-1", "--timeout=60s")
		// Detach, so nothing of this test holds the volume.
		up.Kubectl(t, "delete", "volumeattachment/data-node-1", "--wait=true", "--timeout=60s")
	})
}

// defaultWorkloads are the workloads config/default must deploy: every service.
var defaultWorkloads = []string{
	"Deployment crdipc-system/crdipc-storage-operator",
	"DaemonSet crdipc-system/crdipc-pool-agent",
	"Deployment crdipc-system/crdipc-csi-controller",
	"DaemonSet crdipc-system/crdipc-csi-node",
	"DaemonSet crdipc-system/crdipc-fd-holder",
	"Deployment crdipc-system/crdipc-books",
	"Deployment crdipc-system/crdipc-bitcoin-operator",
	"Deployment crdipc-scm/crdipc-webhook-listener",
	"Deployment crdipc-scm/crdipc-metrics-agent",
}

// defaultObject is what checkDefault reads of an object of config/default.
type defaultObject struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string            `json:"name"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		Replicas *int32 `json:"replicas"`
		Template struct {
			Spec struct {
				ServiceAccountName string             `json:"serviceAccountName"`
				InitContainers     []corev1.Container `json:"initContainers"`
				Containers         []corev1.Container `json:"containers"`
				Volumes            []corev1.Volume    `json:"volumes"`
			} `json:"spec"`
		} `json:"template"`
	} `json:"spec"`
}

// checkDefault checks what a dry run does not: that config/default holds every CRD, every
// service and the namespace crdipc needs, that every container runs the crdipc image of the
// version in VERSION (no upstream sidecar: the CSI node plugin registers with the kubelet
// itself), that each workload's ServiceAccount is deployed with it, that the node plugin's
// sockets are where the kubelet looks, and that it holds no object of a kind the cluster may
// not serve.
func checkDefault(t *testing.T, docs [][]byte) {
	t.Helper()
	raw, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(raw))
	if !regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`).MatchString(version) {
		t.Fatalf("VERSION holds %q, want a semantic version like 0.2.0", version)
	}
	image := "crdipc/crdipc:" + version

	var (
		objects  = map[string]defaultObject{} // "Kind namespace/name"
		crdNames []string
	)
	for _, d := range docs {
		var o defaultObject
		if err := yaml.Unmarshal(d, &o); err != nil {
			t.Fatal(err)
		}
		key := o.Kind + " " + o.Metadata.Name
		if o.Metadata.Namespace != "" {
			key = o.Kind + " " + o.Metadata.Namespace + "/" + o.Metadata.Name
		}
		objects[key] = o
		if o.Metadata.Labels["app.kubernetes.io/part-of"] != "crdipc" {
			t.Errorf("%s: no label app.kubernetes.io/part-of=crdipc", key)
		}
		switch {
		case o.Kind == "CustomResourceDefinition":
			crdNames = append(crdNames, o.Metadata.Name)
		case strings.HasSuffix(o.APIVersion, ".crdipc.io/v1alpha1") || strings.HasPrefix(o.APIVersion, "monitoring.coreos.com/"):
			// A custom resource cannot be dry-run (or applied) in the same apply as its
			// CRD on a fresh cluster, and monitoring.coreos.com is served only where the
			// Prometheus Operator runs.
			t.Errorf("%s (%s): config/default must hold no custom resources", key, o.APIVersion)
		}
		pod := o.Spec.Template.Spec
		for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
			if c.Image != image {
				t.Errorf("%s: container %s runs %s, want %s (config/default's images: newTag = VERSION)", key, c.Name, c.Image, image)
			}
		}
	}
	for key, o := range objects {
		if sa := o.Spec.Template.Spec.ServiceAccountName; sa != "" {
			if _, ok := objects["ServiceAccount "+o.Metadata.Namespace+"/"+sa]; !ok {
				t.Errorf("%s: ServiceAccount %s/%s is not in config/default", key, o.Metadata.Namespace, sa)
			}
		}
	}

	embedded, err := crd.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, c := range embedded {
		want = append(want, c.Name)
	}
	slices.Sort(crdNames)
	if !slices.Equal(crdNames, want) {
		t.Errorf("config/default's CRDs %v, the binary's %v: list every file of config/crd/bases in config/crd/kustomization.yaml", crdNames, want)
	}
	for _, w := range append(slices.Clone(defaultWorkloads), "CSIDriver csi.crdipc.io") {
		if _, ok := objects[w]; !ok {
			t.Errorf("config/default has no %s", w)
		}
	}
	// A drain must not take both replicas of a leader-elected Deployment at once.
	for key, o := range objects {
		if o.Kind == "Deployment" && o.Spec.Replicas != nil && *o.Spec.Replicas >= 2 {
			if _, ok := objects["PodDisruptionBudget "+o.Metadata.Namespace+"/"+o.Metadata.Name]; !ok {
				t.Errorf("%s has %d replicas and no PodDisruptionBudget of its name", key, *o.Spec.Replicas)
			}
		}
	}
	if o, ok := objects["DaemonSet crdipc-system/crdipc-csi-node"]; ok {
		checkCSINode(t, o, objects["DaemonSet crdipc-system/crdipc-fd-holder"])
		checkLocalReplicaSocket(t, o, objects["DaemonSet crdipc-system/crdipc-pool-agent"])
	}
	checkHolderPrivate(t, objects)
	ns, ok := objects["Namespace "+install.SystemNamespace]
	if !ok {
		t.Errorf("config/default has no Namespace %s", install.SystemNamespace)
	} else if got := ns.Metadata.Labels[install.PodSecurityLabel]; got != "privileged" {
		t.Errorf("Namespace %s: label %s=%q, want privileged (as crdipc install sets it)", install.SystemNamespace, install.PodSecurityLabel, got)
	}
}

// checkCSINode checks the kubelet's view of the CSI node plugin, which neither a dry run nor
// anything of `crdipc up` sees: the driver registers through the kubelet's plugins_registry
// on the host, and the CSI socket it tells the kubelet to dial (--kubelet-registration-path,
// by default --endpoint's path) is the host path of the socket it serves. Its volume
// targets' FUSE mounts must outlive the container (a Bidirectional mount, so they are the
// host's), and --fd-holder must be the host path of the fd holder's socket.
func checkCSINode(t *testing.T, o, holder defaultObject) {
	t.Helper()
	const kubeletRoot = "/var/lib/kubelet"
	pod := o.Spec.Template.Spec
	i := slices.IndexFunc(pod.Containers, func(c corev1.Container) bool { return c.Name == "csi-driver" })
	if i < 0 {
		t.Errorf("crdipc-csi-node: no container csi-driver")
		return
	}
	c := pod.Containers[i]
	flags := map[string]string{}
	for _, a := range c.Args {
		if name, value, ok := strings.Cut(a, "="); ok && strings.HasPrefix(name, "--") {
			flags[name] = value
		}
	}
	hostPath := func(path string) string { return hostPathOf(pod.Volumes, c, path) }
	if got := hostPath(flags["--registration-dir"]); flags["--registration-dir"] == "" || got != kubeletRoot+"/plugins_registry" {
		t.Errorf("crdipc-csi-node: --registration-dir=%q is %q on the host, want the kubelet's %s/plugins_registry", flags["--registration-dir"], got, kubeletRoot)
	}
	sock, ok := strings.CutPrefix(flags["--endpoint"], "unix://")
	if !ok {
		t.Errorf("crdipc-csi-node: --endpoint=%q, want unix:///<path>", flags["--endpoint"])
		return
	}
	if m := mountOf(c, flags["--target-dir"]); m == nil || m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
		t.Errorf("crdipc-csi-node: --target-dir=%q is not on a Bidirectional mount: the volume targets' FUSE mounts would go with the container, and a restarted plugin could not serve them again", flags["--target-dir"])
	}
	hp := holder.Spec.Template.Spec
	var socket string
	if len(hp.Containers) == 1 {
		for _, a := range hp.Containers[0].Args {
			if v, ok := strings.CutPrefix(a, "--socket="); ok {
				socket = hostPathOf(hp.Volumes, hp.Containers[0], v)
			}
		}
	}
	if got := hostPath(flags["--fd-holder"]); socket == "" || got != socket {
		t.Errorf("crdipc-csi-node: --fd-holder=%q is %q on the host; the fd holder's socket is %q there", flags["--fd-holder"], got, socket)
	}
	told := flags["--kubelet-registration-path"]
	if told == "" {
		told = sock
	}
	if host := hostPath(sock); host == "" || host != told || !strings.HasPrefix(host, kubeletRoot+"/plugins/") {
		t.Errorf("crdipc-csi-node: the CSI socket %s is %q on the host and the kubelet is told %s: want one path under %s/plugins", sock, host, told, kubeletRoot)
	}
}

// checkLocalReplicaSocket: the node plugin's --local-replica-socket is, on the host, where the
// pool agent serves its local socket (its --local-socket, by default <root>/local/replica.sock),
// and of the agent's directory the plugin mounts that socket's directory only.
func checkLocalReplicaSocket(t *testing.T, csiNode, poolAgent defaultObject) {
	t.Helper()
	args := func(c corev1.Container) map[string]string {
		flags := map[string]string{}
		for _, a := range c.Args {
			if name, value, ok := strings.Cut(a, "="); ok && strings.HasPrefix(name, "--") {
				flags[name] = value
			}
		}
		return flags
	}
	pa := poolAgent.Spec.Template.Spec
	if len(pa.Containers) != 1 {
		t.Errorf("crdipc-pool-agent: %d containers, want 1", len(pa.Containers))
		return
	}
	af := args(pa.Containers[0])
	served := af["--local-socket"]
	if served == "" {
		served = agent.LocalSocket(af["--root"])
	}
	want := hostPathOf(pa.Volumes, pa.Containers[0], served)
	pod := csiNode.Spec.Template.Spec
	i := slices.IndexFunc(pod.Containers, func(c corev1.Container) bool { return c.Name == "csi-driver" })
	if i < 0 {
		return // checkCSINode says so
	}
	c := pod.Containers[i]
	flag := args(c)["--local-replica-socket"]
	if got := hostPathOf(pod.Volumes, c, flag); flag == "" || want == "" || got != want {
		t.Errorf("crdipc-csi-node: --local-replica-socket=%q is %q on the host; the pool agent serves its local socket at %q there", flag, got, want)
	}
	if m := mountOf(c, flag); m != nil && m.MountPath != filepath.Dir(flag) {
		t.Errorf("crdipc-csi-node mounts %s for its local replica socket: want that socket's directory only, not the pool agent's data", m.MountPath)
	}
}

// checkHolderPrivate: whoever can use the fd holder's socket can read every staged volume's
// data, so no workload but the holder and the node plugin mounts its directory, or one
// above it, from the host.
func checkHolderPrivate(t *testing.T, objects map[string]defaultObject) {
	t.Helper()
	holder := objects["DaemonSet crdipc-system/crdipc-fd-holder"].Spec.Template.Spec
	var dir string
	for _, c := range holder.Containers {
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--socket="); ok {
				dir = filepath.Dir(hostPathOf(holder.Volumes, c, v))
			}
		}
	}
	if dir == "" || dir == "." {
		t.Errorf("crdipc-fd-holder: no --socket on a hostPath volume")
		return
	}
	for key, o := range objects {
		if key == "DaemonSet crdipc-system/crdipc-fd-holder" || key == "DaemonSet crdipc-system/crdipc-csi-node" {
			continue
		}
		for _, v := range o.Spec.Template.Spec.Volumes {
			if v.HostPath != nil && (v.HostPath.Path == dir || strings.HasPrefix(dir, strings.TrimSuffix(v.HostPath.Path, "/")+"/")) {
				t.Errorf("%s mounts %s from the host, which holds the fd holder's socket (%s): only the holder and the node plugin may", key, v.HostPath.Path, dir)
			}
		}
	}
}

// mountOf is the volume mount of c that path inside the container is on, nil if none.
func mountOf(c corev1.Container, path string) *corev1.VolumeMount {
	var best *corev1.VolumeMount
	for j, m := range c.VolumeMounts {
		if (path == m.MountPath || strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/")) && (best == nil || len(m.MountPath) > len(best.MountPath)) {
			best = &c.VolumeMounts[j]
		}
	}
	return best
}

// hostPathOf is where path inside container c (of a pod with volumes) is on the host, ""
// if it is not on a hostPath volume.
func hostPathOf(volumes []corev1.Volume, c corev1.Container, path string) string {
	m := mountOf(c, path)
	if m == nil {
		return ""
	}
	for _, v := range volumes {
		if v.Name == m.Name && v.HostPath != nil {
			return v.HostPath.Path + strings.TrimPrefix(path, m.MountPath)
		}
	}
	return ""
}

// checkDryRun checks the outcome of kubectl args (an apply --dry-run=server): no error, and
// the server answered for want objects.
func checkDryRun(t *testing.T, args []string, out string, err error, want int) {
	t.Helper()
	cmd := "kubectl " + strings.Join(args, " ")
	if err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, out)
	}
	if got := strings.Count(out, "(server dry run)"); got != want || want == 0 {
		t.Fatalf("%s: %d objects dry-run, want %d:\n%s", cmd, got, want, out)
	}
	t.Logf("%s:\n%s", cmd, out)
}

// decodeDocuments splits a YAML stream into its non-empty documents, as JSON.
// mustJSON is v as JSON, map keys sorted: two equal objects give equal bytes.
func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decodeDocuments(t *testing.T, name string, body []byte) [][]byte {
	t.Helper()
	var docs [][]byte
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(body)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		j, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s := string(bytes.TrimSpace(j)); s != "null" && s != "{}" {
			docs = append(docs, j)
		}
	}
}

// documentKinds returns the kind of each document ("" where it has none).
func documentKinds(docs [][]byte) []string {
	kinds := make([]string, len(docs))
	for i, d := range docs {
		var tm struct{ Kind string }
		_ = yaml.Unmarshal(d, &tm)
		kinds[i] = tm.Kind
	}
	return kinds
}

// serviceMonitor is the part of a monitoring.coreos.com/v1 ServiceMonitor checked here.
type serviceMonitor struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels      map[string]string `json:"matchLabels"`
			MatchExpressions []struct {
				Key      string   `json:"key"`
				Operator string   `json:"operator"`
				Values   []string `json:"values"`
			} `json:"matchExpressions"`
		} `json:"selector"`
		Endpoints []struct {
			Port string `json:"port"`
			Path string `json:"path"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// checkServiceMonitor checks that m selects Services of its namespace among services, and
// that each endpoint names a port one of them has.
func checkServiceMonitor(t *testing.T, m serviceMonitor, services []corev1.Service) {
	t.Helper()
	selected := map[string]bool{} // port names
	for _, s := range services {
		if s.Namespace != m.Metadata.Namespace || !monitorSelects(m, s.Labels) {
			continue
		}
		for _, p := range s.Spec.Ports {
			selected[p.Name] = true
		}
	}
	if len(selected) == 0 {
		t.Fatalf("ServiceMonitor %s selects none of the Services in %s", m.Metadata.Name, m.Metadata.Namespace)
	}
	for _, e := range m.Spec.Endpoints {
		if !selected[e.Port] {
			t.Errorf("ServiceMonitor %s: endpoint port %q is not a port of the Services it selects", m.Metadata.Name, e.Port)
		}
	}
}

func monitorSelects(m serviceMonitor, labels map[string]string) bool {
	for k, v := range m.Spec.Selector.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	for _, e := range m.Spec.Selector.MatchExpressions {
		v, ok := labels[e.Key]
		switch e.Operator {
		case "In":
			if !ok || !slices.Contains(e.Values, v) {
				return false
			}
		case "NotIn":
			if ok && slices.Contains(e.Values, v) {
				return false
			}
		case "Exists":
			if !ok {
				return false
			}
		case "DoesNotExist":
			if ok {
				return false
			}
		default:
			return false
		}
	}
	return true
}
