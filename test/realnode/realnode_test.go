package realnode

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/crdipc/crdipc/internal/testenv/kubectl"
	"github.com/crdipc/crdipc/internal/testenv/podmanifest"
	"github.com/crdipc/crdipc/internal/testenv/realnodeplan"
	"github.com/crdipc/crdipc/internal/testenv/require"
)

const (
	// requireEnv makes a missing capability a failure instead of a skip (CI sets it).
	requireEnv = "CRDIPC_REQUIRE_REAL_NODE"
	// advertise is the bridge address the harness gives the host, where the API server
	// also serves for the nodes and their pods.
	advertise = realnodeplan.HostIP
	// node is the first real node, where the single-node flows run.
	node = "real-1"
)

// realNode is one node hack/realnode.sh joins: real-N has index N, its address and work
// directory (containerd, kubelet, logs) from realnodeplan.
type realNode struct {
	name  string
	index int
}

func nodeN(i int) realNode { return realNode{name: realnodeplan.NodeN(i).Name(), index: i} }

func (n realNode) plan() realnodeplan.Node { return realnodeplan.NodeN(n.index) }

// dir is the node's work directory; short, for socket paths.
func (n realNode) dir() string { return n.plan().Dir() }

func (n realNode) ip() string { return n.plan().IP() }

var root string // the repository

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// capable skips (or, under requireEnv, fails) when this machine cannot run a real node:
// what no install script can provide. The tools deps installs are checked after it ran
// (installed).
func capable(t *testing.T) {
	t.Helper()
	var root error
	if os.Geteuid() != 0 {
		root = errors.New("root")
	}
	if err := errors.Join(root, require.Missing("kubectl", "apt-get")); err != nil {
		require.Capable(t, requireEnv, fmt.Errorf("a real node needs %w", err))
	}
}

// installed fails (or skips) when what `make image` and `hack/realnode.sh deps` install, or
// what the nodes use besides, is missing after they ran.
func installed(t *testing.T) {
	t.Helper()
	if err := require.Missing("ip", "iptables", "mount"); err != nil {
		require.Capable(t, requireEnv, fmt.Errorf("a real node needs %w", err))
	}
}

// run runs a command in the repository with env added, and fails the test with its
// output when it fails.
func run(t *testing.T, timeout time.Duration, env []string, name string, args ...string) string {
	t.Helper()
	out, err := runErr(timeout, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func runErr(timeout time.Duration, env []string, name string, args ...string) (string, error) {
	host := kubectl.Client{Env: env, Dir: root}
	return host.RunFor(timeout, name, args...)
}

// cluster is `crdipc up` with real nodes joined.
type cluster struct {
	binary     string
	image      string
	kubeconfig string
	dataDir    string
	creds      string // the nodes' and kube-proxy's kubeconfigs
	// kc runs kubectl (and other commands) on the cluster, in the repository.
	kc *kubectl.Client
	// doc runs docs/deploy.md's harness block, which starts up as its background job.
	doc    *harness
	joined []realNode
	// webhookKey is the webhook listener's secret, once crdipc-webhook-secret is created.
	webhookKey string
}

func (c *cluster) env() []string { return []string{"KUBECONFIG=" + c.kubeconfig} }

func (c *cluster) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	return c.kc.Kubectl(t, args...)
}

// wait runs `kubectl wait` with a deadline; on failure it shows what the objects are.
func (c *cluster) wait(t *testing.T, timeout time.Duration, args ...string) {
	t.Helper()
	c.kc.Wait(t, timeout, args...)
}

// describe is the state a failure needs to be understood: pods, events, nodes, the logs
// of crdipc's pods and of the nodes, the last lines of up's output.
func (c *cluster) describe() string { return c.kc.Dump() }

// nodesState is what describe adds to the cluster's objects.
func (c *cluster) nodesState() string {
	var b strings.Builder
	for _, ns := range []string{"crdipc-system", "crdipc-scm"} {
		args := []string{"logs", "-n", ns, "-l", "app.kubernetes.io/part-of=crdipc", "--all-containers", "--prefix", "--tail=15", "--max-log-requests=20"}
		out, _ := c.kc.RunFor(time.Minute, "kubectl", args...)
		fmt.Fprintf(&b, "$ kubectl %s\n%s\n", strings.Join(args, " "), out)
	}
	fmt.Fprintf(&b, "the harness session (crdipc up is its background job):\n%s\n", tail(c.doc.session.Output(), 30))
	for _, n := range c.joined {
		for _, log := range []string{"kubelet.log", "containerd.log", "kube-proxy.log"} {
			data, _ := os.ReadFile(filepath.Join(n.dir(), "logs", log))
			fmt.Fprintf(&b, "%s %s:\n%s\n", n.name, log, tail(string(data), 20))
		}
	}
	return b.String()
}

func tail(s string, n int) string { return kubectl.Tail(s, n) }

// TestRealNode builds the image, joins a real node to `crdipc up` and runs what a user
// runs on it, in order: each step needs the one before.
func TestRealNode(t *testing.T) {
	capable(t)
	root = repoRoot(t)
	c := &cluster{
		binary: filepath.Join(root, "bin", "crdipc"),
		image:  filepath.Join(root, "bin", "crdipc-image.tar"),
		// Where the block's commands write the nodes' and kube-proxy's kubeconfigs.
		creds: "/tmp",
	}
	start := time.Now()
	phase := func(what string) {
		t.Logf("%-52s %6.1f s", what, time.Since(start).Seconds())
		start = time.Now()
	}

	// docs/deploy.md's harness block as written, in one bash in a fresh directory: up's
	// data directory is that directory's .crdipc.
	c.useHarness(startHarness(t))
	t.Cleanup(func() {
		for _, f := range []string{"kube-proxy", "real-1", "real-2", "real-3", "real-4"} {
			_ = os.Remove(filepath.Join(c.creds, f+".kubeconfig"))
		}
	})

	// The image; its binary, bin/crdipc, is also the one that runs up.
	c.doc.runThrough(t, 20*time.Minute, "make image", c.describe)
	phase("make image")
	// The nodes' components: containerd, runc, CNI plugins (Debian), kubelet and
	// kube-proxy (built from the Kubernetes module), the pause, busybox, fio and btcd
	// images. Only then can the tools they bring be checked for.
	c.doc.runThrough(t, 30*time.Minute, "hack/realnode.sh deps", c.describe)
	phase("hack/realnode.sh deps")
	installed(t)
	// Leftovers of an interrupted run would make join refuse: clean them first.
	for i := 1; i <= 4; i++ {
		run(t, 3*time.Minute, nil, "hack/realnode.sh", "down", "--dir", nodeN(i).dir())
	}
	c.doc.runThrough(t, time.Minute, "hack/realnode.sh network", c.describe)
	// The bridge, if no node joins (a down of a directory holding no node).
	t.Cleanup(func() { c.down(t, nodeN(1)) })

	// Cleanups run last first: the nodes go while the API server still answers, so their
	// pods are deleted through their kubelets; the block's own down loop for its three
	// nodes, after the nodes the test joined itself.
	t.Cleanup(func() {
		for i := len(c.joined) - 1; i >= 3; i-- {
			c.down(t, c.joined[i])
		}
		if c.doc.down(t, 10*time.Minute) {
			return
		}
		for i := min(len(c.joined), 3) - 1; i >= 0; i-- {
			c.down(t, c.joined[i])
		}
	})

	c.upAndJoin(t)
	phase("crdipc up --services=none --nodes 0; three nodes joined and Ready")

	t.Run("node", func(t *testing.T) { c.testNode(t) })
	if t.Failed() {
		return
	}
	t.Run("pod scheduled and its logs", func(t *testing.T) { c.testPod(t) })
	phase("a pod scheduled, its logs read")
	if t.Failed() {
		return
	}
	// The previous release deployed, then upgraded in place to this one: the upgrade ends
	// with the harness block's own apply of config/default.
	t.Run("upgrade from the previous release", func(t *testing.T) { c.testUpgrade(t, phase) })
	if t.Failed() {
		return
	}
	t.Run("config/default", func(t *testing.T) {
		c.doc.runThrough(t, 6*time.Minute, "kubectl wait --for=condition=Available deployment", c.describe)
		c.testDeploy(t)
	})
	phase("config/default available")
	if t.Failed() {
		return
	}
	t.Run("book", func(t *testing.T) {
		out := c.doc.runThrough(t, 2*time.Minute, "bin/crdipc call", c.describe)
		if !strings.Contains(out, "Ready") {
			t.Errorf("crdipc call: %s", out)
		}
	})
	phase("a Book Ready")
	t.Run("webhook", func(t *testing.T) { c.testWebhook(t) })
	phase("a webhook delivery → PullRequest, Event, metrics")
	t.Run("bitcoin", func(t *testing.T) { c.testBitcoin(t) })
	phase("btcd network linked, relinked, scaled 3 → 5 → 2")
	t.Run("volume", func(t *testing.T) { c.testVolume(t) })
	phase("a volume written and read back")
	if t.Failed() {
		return
	}
	// The bucket and key outlive this cluster: the last step restores in a new one.
	off := startOffsite(t)
	t.Run("backup", func(t *testing.T) { c.testBackup(t, off) })
	phase("256 MiB backed up (its uploader killed), 1 % changed, backed up again")
	if t.Failed() {
		return
	}
	t.Run("every workload restarted, the node plugin killed", func(t *testing.T) { c.testRestarts(t, phase) })
	if t.Failed() {
		return
	}
	// Last: they lose nodes.
	t.Run("replicated volume and a lost node", func(t *testing.T) { c.testReplicated(t, phase) })
	if t.Failed() {
		return
	}
	t.Run("data-path identities", func(t *testing.T) { c.testDataPathIdentities(t, nodeN(1), nodeN(3), nodeN(4)) })
	t.Run("the target's node lost", func(t *testing.T) { c.testTargetLost(t, phase) })

	// The disaster: the nodes and up go, and up's data directory with them. A new cluster,
	// as the harness block makes one, given the bucket and the key alone, restores.
	c.rebuild(t, off)
	phase("the cluster destroyed; a new up, three nodes joined anew, config/default")
	t.Run("a new cluster restores the backup", func(t *testing.T) { c.testRecovery(t, off) })
	phase("the backup found and restored in the new cluster")
}

// rebuild destroys the cluster (every node down, up stopped, its data directory removed),
// restarts the S3 server on its directory (nothing else is carried over), and runs the
// harness block again, from a fresh directory, up to config/default Available. The image
// and the nodes' components are the ones built already.
func (c *cluster) rebuild(t *testing.T, o *offsite) {
	t.Helper()
	for i := len(c.joined) - 1; i >= 3; i-- {
		c.down(t, c.joined[i])
	}
	if !c.doc.down(t, 10*time.Minute) {
		t.Fatalf("the harness session ended: the cluster cannot be taken down as the block does")
	}
	c.joined = nil
	if err := c.doc.session.Close(time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(c.dataDir); err != nil {
		t.Fatalf("removing up's data directory: %v", err)
	}

	c.useHarness(startHarness(t))
	c.doc.skipThrough(t, "hack/realnode.sh deps")
	c.doc.runThrough(t, time.Minute, "hack/realnode.sh network", c.describe)
	// On the bridge's address, which is back.
	o.restart(t)
	c.upAndJoin(t)
	c.doc.runThrough(t, 6*time.Minute, "kubectl wait --for=condition=Available deployment", c.describe)
}

// useHarness makes h the cluster's harness: up's data directory is h's ./.crdipc.
func (c *cluster) useHarness(h *harness) {
	c.doc = h
	c.dataDir = filepath.Join(h.dir, ".crdipc")
	c.kubeconfig = filepath.Join(c.dataDir, "kubeconfig")
	c.kc = &kubectl.Client{Env: c.env(), Dir: root, Timeout: 3 * time.Minute, State: c.nodesState}
}

// upAndJoin runs the block's up (nothing but the control plane, in the background) and its
// join loop for real-1 to real-3, and waits for the three nodes to be Ready.
func (c *cluster) upAndJoin(t *testing.T) {
	t.Helper()
	c.doc.runThrough(t, 3*time.Minute, "export KUBECONFIG=", c.describe)
	c.joined = []realNode{nodeN(1), nodeN(2), nodeN(3)}
	c.doc.runThrough(t, 15*time.Minute, "for i in 1 2 3; do", c.describe)
	for _, n := range c.joined {
		c.wait(t, 2*time.Minute, "--for=condition=Ready", "node/"+n.name)
	}
}

// server is the API server's address for the nodes: up's port on the advertise address
// (the admin kubeconfig names 127.0.0.1, which is each node's own loopback).
func (c *cluster) server(t *testing.T) string {
	t.Helper()
	u := c.kubectl(t, "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")
	i := strings.LastIndex(u, ":")
	if i < 0 {
		t.Fatalf("kubeconfig server %q has no port", u)
	}
	return "https://" + advertise + u[i:]
}

// join issues node n's credentials (a CSR for system:node:<name>) and joins it.
func (c *cluster) join(t *testing.T, n realNode) {
	t.Helper()
	kubeconfig := filepath.Join(c.creds, n.name+".kubeconfig")
	run(t, time.Minute, c.env(), c.binary, "kubeconfig", "--node", n.name, "--server", c.server(t), "-o", kubeconfig)
	c.joined = append(c.joined, n)
	run(t, 5*time.Minute, c.env(), "hack/realnode.sh", append(append([]string{"join"}, n.plan().JoinFlags()...),
		"--kubeconfig", kubeconfig, "--proxy-kubeconfig", filepath.Join(c.creds, "kube-proxy.kubeconfig"),
		"--ca", filepath.Join(c.dataDir, "pki", "ca.crt"), "--image", c.image)...)
	c.wait(t, 2*time.Minute, "--for=condition=Ready", "node/"+n.name)
}

func (c *cluster) down(t *testing.T, n realNode) {
	if out, err := runErr(5*time.Minute, c.env(), "hack/realnode.sh", "down", "--dir", n.dir()); err != nil {
		t.Errorf("hack/realnode.sh down --dir %s: %v\n%s", n.dir(), err, out)
	}
}

// poll waits, until timeout, for cond to hold, failing with the last state cond reported
// and the cluster's state. kubectl has nothing to watch for these.
func (c *cluster) poll(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	c.kc.Eventually(t, timeout, what, func(context.Context) (bool, error) {
		if ok, state := cond(); !ok {
			return false, fmt.Errorf("last: %s", state)
		}
		return true, nil
	})
}

// testNode: the kubelet keeps anonymous access off, the control plane clears the
// not-ready taint and publishes kube-root-ca.crt by itself.
func (c *cluster) testNode(t *testing.T) {
	// Anonymous requests to the kubelet are refused: the API server's own calls (logs,
	// below) authenticate with its kubelet client certificate.
	out, err := runErr(30*time.Second, nil, "curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", "https://"+nodeN(1).ip()+":10250/pods")
	if err != nil && out == "" {
		t.Fatalf("curl the kubelet: %v", err)
	}
	if out != "401" {
		t.Errorf("an anonymous request to the kubelet: HTTP %s, want 401", out)
	}
	c.wait(t, time.Minute, "--for=jsonpath={.data.ca\\.crt}", "configmap/kube-root-ca.crt", "-n", "default")
	c.poll(t, time.Minute, "node "+node+" without the not-ready taint", func() (bool, string) {
		taints := c.kubectl(t, "get", "node", node, "-o", "jsonpath={.spec.taints}")
		return !strings.Contains(taints, "not-ready"), taints
	})
}

// testPod: a busybox pod that names no node is scheduled to the real node, runs, and its
// output is what `kubectl logs` shows.
func (c *cluster) testPod(t *testing.T) {
	hello := podmanifest.Shell("hello", "busybox", "echo hello from $(hostname) on the real node; cat /var/run/secrets/kubernetes.io/serviceaccount/namespace")
	hello.PullPolicy = podmanifest.PullNever
	c.apply(t, hello.Manifest())
	c.wait(t, 2*time.Minute, "--for=jsonpath={.status.phase}=Succeeded", "pod/hello")
	if got := c.kubectl(t, "get", "pod", "hello", "-o", "jsonpath={.spec.nodeName}"); !strings.HasPrefix(got, "real-") {
		t.Errorf("pod hello on %q, want a real node", got)
	}
	logs := c.kubectl(t, "logs", "hello")
	if !strings.Contains(logs, "hello from hello on the real node") || !strings.Contains(logs, "default") {
		t.Errorf("kubectl logs hello: %q", logs)
	}
	c.kubectl(t, "delete", "pod", "hello", "--wait=true")
}

func (c *cluster) apply(t *testing.T, manifest string) {
	t.Helper()
	c.kc.Apply(t, manifest)
}

// testDeploy: config/default, applied server-side by docs/deploy.md's harness block with
// the image imported into the nodes: every Deployment and DaemonSet of crdipc-system
// becomes available, and kubectl exec reaches a pod.
func (c *cluster) testDeploy(t *testing.T) {
	// kubectl exec goes through the API server's kubelet client certificate too.
	out := c.kubectl(t, "exec", "-n", "crdipc-system", "deployment/crdipc-books", "--", "/usr/local/bin/crdipc", "version")
	if !strings.Contains(out, "crdipc") {
		t.Errorf("kubectl exec crdipc version in a books pod: %q", out)
	}
	// Every Deployment available, and each DaemonSet's pod on every node.
	c.rolledOut(t, "crdipc-system")
}

// testWebhook: a signed GitHub delivery to the webhook listener's Service (kube-proxy
// routes it to a pod on the node) becomes a PullRequest and an Event, which the metrics
// agent's pod reports on its Service's /metrics.
func (c *cluster) testWebhook(t *testing.T) {
	c.webhookSecret(t)
	pr := c.deliverPR(t, 42, false)
	if evs := strings.Fields(c.kubectl(t, "-n", "crdipc-scm", "get", "events", "--field-selector", "involvedObject.kind=PullRequest,involvedObject.name="+pr, "-o", "name")); len(evs) != 1 {
		t.Errorf("events of PullRequest %s after the delivery: %v", pr, evs)
	}
	service := func(name string) string {
		return c.kubectl(t, "-n", "crdipc-scm", "get", "service", name, "-o", "jsonpath={.spec.clusterIP}")
	}
	client := &http.Client{Timeout: 30 * time.Second}
	metrics := "http://" + service("crdipc-metrics-agent") + ":9102/metrics"
	c.poll(t, time.Minute, "the metrics agent reporting the open pull request", func() (bool, string) {
		res, err := client.Get(metrics)
		if err != nil {
			return false, err.Error()
		}
		defer res.Body.Close()
		parser := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := parser.TextToMetricFamilies(res.Body)
		if err != nil {
			return false, err.Error()
		}
		for _, m := range mfs["crdipc_scm_pullrequests"].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "state" && l.GetValue() == "open" && m.GetGauge().GetValue() == 1 {
					return true, ""
				}
			}
		}
		return false, fmt.Sprint(mfs["crdipc_scm_pullrequests"])
	})
}

// testVolume: a pool on the real node through the pool agent's DaemonSet, a claim of one
// replica, a pod on the node writes through the CSI node plugin (staged and published by
// the real kubelet, after the attach/detach controller's VolumeAttachment is attached by
// crdipc's sidecar), and a second pod reads the bytes back.
func (c *cluster) testVolume(t *testing.T) {
	c.kubectl(t, "apply", "-f", "config/samples/csi/storage_v1alpha1_storagepoolclaim.yaml")
	c.apply(t, `apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: crdipc-one}
provisioner: csi.crdipc.io
parameters: {replicaCount: "1"}
reclaimPolicy: Delete
volumeBindingMode: Immediate
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  storageClassName: crdipc-one
  accessModes: ["ReadWriteOnce"]
  resources: {requests: {storage: 64Mi}}
`)
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Bound", "pvc/data")
	pod := func(name, script string) string { return podWithClaim(name, "", "busybox", "data", "sh", "-c", script) }
	c.apply(t, pod("writer", "dd if=/dev/urandom of=/data/blob bs=1M count=8 2>/dev/null && sha256sum /data/blob && sync"))
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Succeeded", "pod/writer")
	written := strings.Fields(c.kubectl(t, "logs", "writer"))
	if len(written) == 0 {
		t.Fatal("the writer printed no checksum")
	}
	on := c.kubectl(t, "get", "pod", "writer", "-o", "jsonpath={.spec.nodeName}")
	attached := c.kubectl(t, "get", "volumeattachments", "-o", "jsonpath={range .items[*]}{.spec.nodeName} {.status.attached}{\"\\n\"}{end}")
	if !strings.Contains(attached, on+" true") {
		t.Errorf("volume attachments: %q, want one attached to %s, the writer's node", attached, on)
	}
	c.kubectl(t, "delete", "pod", "writer", "--wait=true")

	c.apply(t, pod("reader", "sha256sum /data/blob"))
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Succeeded", "pod/reader")
	read := strings.Fields(c.kubectl(t, "logs", "reader"))
	if len(read) == 0 || read[0] != written[0] {
		t.Fatalf("read back %v, written %v", read, written)
	}
	c.kubectl(t, "delete", "pod", "reader", "--wait=true")

	// With the pods gone the bytes are in the replica's file on the node, where the pool
	// agent keeps it: the data is the storage system's, not the pod's.
	var holds bool
	for _, n := range c.joined {
		holds = holds || replicaHolds(t, filepath.Join(n.dir(), "crdipc"), written[0])
	}
	if !holds {
		t.Errorf("no replica file under the nodes' /var/lib/crdipc holds the written blob")
	}
}

// replicaHolds reports whether a replica file under dir holds a file system whose bytes
// include the blob with the given sha256: checked by mounting the replica file read-only.
func replicaHolds(t *testing.T, dir, want string) bool {
	t.Helper()
	var found bool
	_ = filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		if err != nil || found || !info.Mode().IsRegular() || info.Size() < 32<<20 {
			return nil
		}
		mnt := t.TempDir()
		if out, err := exec.Command("mount", "-o", "ro,loop,noload", path, mnt).CombinedOutput(); err != nil {
			t.Logf("mount %s: %v %s", path, err, out)
			return nil
		}
		defer exec.Command("umount", mnt).Run()
		f, err := os.Open(filepath.Join(mnt, "blob"))
		if err != nil {
			return nil
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err == nil && hex.EncodeToString(h.Sum(nil)) == want {
			found = true
		}
		return nil
	})
	return found
}

// podWithClaim is a pod that runs command in image on node ("": kube-scheduler chooses)
// once, with the claim mounted at /data.
func podWithClaim(name, node, image, claim string, command ...string) string {
	return podmanifest.Pod{Name: name, Node: node, Image: image, PullPolicy: podmanifest.PullNever,
		Command: command, Claim: claim}.Manifest()
}
