package realnode

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// fioArgs is the data checker: fio writes the file in 64 KiB blocks, each with a crc32c
// checksum and its offset in a header, and then reads every block back and verifies it
// (do_verify, the default for a write job), once per loop; --verify_fatal stops at the
// first bad block. The same arguments with --verify_only=1 verify what an earlier run wrote.
var fioArgs = []string{"fio", "--name=verify", "--filename=/data/fio.dat", "--size=32M", "--bs=64k",
	"--rw=randwrite", "--ioengine=psync", "--direct=1", "--verify=crc32c", "--verify_fatal=1"}

// testReplicated is seed 000's promise on real machines: a 3-replica volume gets one replica
// per node; a pod on real-1 writes through the target on its node to the replicas on the
// others over their addresses; real-2 is lost for real mid-run (link down, every process
// killed) and fio finishes with every block verified; real-2 turns Unknown; a fourth node
// joins and receives a rebuilt replica, byte-identical to the others; a pod on real-3 reads
// every byte back.
func (c *cluster) testReplicated(t *testing.T, phase func(string)) {
	a, b, nc, d := nodeN(1), nodeN(2), nodeN(3), nodeN(4)
	// The operator replaces a replica that stays Offline on a node that still exists after
	// --replace-after (5 min by default): a user's setting, shortened so CI does not wait.
	c.kubectl(t, "-n", "crdipc-system", "patch", "deployment", "crdipc-storage-operator", "--type=json",
		"-p", `[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--replace-after=20s"}]`)
	c.kubectl(t, "-n", "crdipc-system", "rollout", "status", "deployment/crdipc-storage-operator", "--timeout=3m")

	c.apply(t, `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: replicated, namespace: default}
spec:
  storageClassName: crdipc
  accessModes: ["ReadWriteOnce"]
  resources: {requests: {storage: 256Mi}}
`)
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Bound", "pvc/replicated")
	volume := c.kubectl(t, "get", "pvc", "replicated", "-o", "jsonpath={.spec.volumeName}")
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Healthy", "-n", "crdipc-system", "cstorvolume/"+volume)
	if got := c.replicaNodes(t, volume); strings.Join(got, " ") != "real-1 real-2 real-3" {
		t.Fatalf("replicas of %s on %v, want one on each of real-1 real-2 real-3", volume, got)
	}

	// 40 loops of 32 MiB, each written and verified (~1 min here): long enough that real-2
	// is lost while fio writes, and that the loss is noticed (node lease, 40 s) before it ends.
	c.apply(t, fioPod("fio-writer", a.name, append(fioArgs, "--loops=40")))
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Running", "pod/fio-writer")
	// Data reached real-2's replica over the network: the loss is mid-run.
	c.poll(t, 2*time.Minute, "fio's writes on real-2's replica", func() (bool, string) {
		n := c.allocated(t, b, volume)
		return n >= 8<<20, fmt.Sprintf("%d bytes allocated", n)
	})
	phase("3-replica volume, fio writing from real-1")
	// real-1's target reaches the replica on real-1 over the pool agent's local socket
	// (config/csi/node.yaml mounts it), and reads it through the descriptor of its file the
	// agent hands over that socket. The plugin's earlier volumes may have fallen back to TLS
	// while an agent restarted: those are logged, not failed.
	c.poll(t, time.Minute, "real-1's node plugin counting connections over its local replica socket and sessions reading its file", func() (bool, string) {
		links, err := c.localReplicaLinks(a.name)
		if err != nil {
			return false, err.Error()
		}
		return links["link:socket"] >= 1 && links["reads:file"] >= 1, fmt.Sprintf("the local replica's connections by link and sessions by reads: %v", links)
	})
	if links, err := c.localReplicaLinks(a.name); err == nil {
		t.Logf("real-1's node plugin reached the replica on its node: %v", links)
	}
	// docs/deploy.md's harness block loses real-2 with this very command.
	kill := "hack/realnode.sh kill --dir " + b.dir()
	if doc := c.doc.commandCode(t, "hack/realnode.sh kill"); doc != kill {
		t.Errorf("%s's harness block loses a node with %q; the test runs %q", harnessDoc, doc, kill)
	}
	run(t, time.Minute, nil, "hack/realnode.sh", "kill", "--dir", b.dir())
	if p := c.kubectl(t, "get", "pod", "fio-writer", "-o", "jsonpath={.status.phase}"); p != "Running" {
		t.Fatalf("fio-writer %s when real-2 was lost: the loss must come mid-run (make the run longer)", p)
	}
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Degraded", "-n", "crdipc-system", "cstorvolume/"+volume)
	degradedWhileWriting := c.kubectl(t, "get", "pod", "fio-writer", "-o", "jsonpath={.status.phase}") == "Running"
	t.Logf("volume Degraded while fio still wrote: %v", degradedWhileWriting)
	c.wait(t, 5*time.Minute, "--for=jsonpath={.status.phase}=Succeeded", "pod/fio-writer")
	written := c.fioResult(t, "fio-writer")
	phase("real-2 lost mid-run; fio: every block verified")

	// The node lifecycle controller notices the lost kubelet.
	c.wait(t, 2*time.Minute, "--for=condition=Ready=Unknown", "node/"+b.name)
	c.poll(t, time.Minute, "node real-2 tainted unreachable:NoExecute", func() (bool, string) {
		taints := c.kubectl(t, "get", "node", b.name, "-o", `jsonpath={range .spec.taints[*]}{.key}:{.effect}{" "}{end}`)
		return strings.Contains(taints, "node.kubernetes.io/unreachable:NoExecute"), taints
	})
	// real-2 is gone for good, and the user says so: its pods, crdipc's own among them, are
	// deleted and started again on the nodes left (otherwise they wait out their 300 s
	// toleration of unreachable).
	c.kubectl(t, "taint", "node", b.name, "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute")

	// A fourth node joins: the pool claim gives it a pool, the operator the lost replica's
	// replacement, rebuilt from the healthy ones.
	c.join(t, d)
	c.poll(t, 4*time.Minute, "a rebuilt replica on real-4 and the volume Healthy", func() (bool, string) {
		nodes := c.replicaNodes(t, volume)
		vol := c.kubectl(t, "get", "-n", "crdipc-system", "cstorvolume", volume, "-o", "jsonpath={.status.phase} {.status.readyReplicas}")
		healthy := c.kubectl(t, "get", "-n", "crdipc-system", "cstorvolumereplicas", "--field-selector", "spec.nodeName="+d.name,
			"-o", "jsonpath={range .items[*]}{.spec.volume}={.status.phase}{\" \"}{end}")
		return vol == "Healthy 3" && strings.Contains(healthy, volume+"=Healthy"), fmt.Sprintf("replicas on %v, volume %s, real-4: %s", nodes, vol, healthy)
	})
	phase("real-4 joined, its replica rebuilt")

	// The writer gone and the volume detached from real-1, nothing writes: every healthy
	// replica holds the same bytes.
	c.kubectl(t, "delete", "pod", "fio-writer", "--wait=true")
	c.poll(t, 2*time.Minute, "the volume detached from real-1", func() (bool, string) {
		out := c.kubectl(t, "get", "volumeattachments", "-o", "jsonpath={range .items[*]}{.spec.source.persistentVolumeName}{\" \"}{end}")
		return !strings.Contains(out, volume), out
	})
	sums := map[string]string{}
	for _, n := range []realNode{a, nc, d} {
		sums[n.name] = c.replicaSum(t, n, volume)
	}
	if sums[a.name] != sums[nc.name] || sums[a.name] != sums[d.name] {
		t.Errorf("replica files differ (sha256 by node): %v", sums)
	}

	// A pod on real-3 verifies every block fio wrote and hashes the file.
	c.apply(t, fioPod("fio-reader", nc.name, append(fioArgs, "--verify_only=1")))
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Succeeded", "pod/fio-reader")
	if read := c.fioResult(t, "fio-reader"); read != written {
		t.Errorf("real-3 read a file with sha256 %s; real-1 wrote %s", read, written)
	}
	c.kubectl(t, "delete", "pod", "fio-reader", "--wait=true")
	phase("real-3 read every byte back")
}

// fioPod runs fio on node with the claim "replicated" at /data, then prints the file's
// sha256 (busybox's sha256sum, in the fio image).
func fioPod(name, node string, args []string) string {
	return podWithClaim(name, node, "docker.io/library/fio:latest", "replicated",
		append([]string{"sh", "-c", `"$@" && sha256sum /data/fio.dat`, "fio-then-sha256"}, args...)...)
}

// fioResult checks that fio in pod name exited 0 with no error, and returns the file's
// sha256 the pod printed last.
func (c *cluster) fioResult(t *testing.T, pod string) string {
	t.Helper()
	logs := c.kubectl(t, "logs", pod)
	code := c.kubectl(t, "get", "pod", pod, "-o", "jsonpath={.status.containerStatuses[0].state.terminated.exitCode}")
	if code != "0" || !strings.Contains(logs, "err= 0") {
		t.Fatalf("%s: exit code %s\n%s", pod, code, tail(logs, 40))
	}
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) != 2 || f[1] != "/data/fio.dat" || len(f[0]) != 64 {
		t.Fatalf("%s: no sha256 line at the end of its output:\n%s", pod, tail(logs, 5))
	}
	return f[0]
}

// replicaNodes lists the nodes of volume's replicas, sorted.
func (c *cluster) replicaNodes(t *testing.T, volume string) []string {
	t.Helper()
	out := c.kubectl(t, "get", "-n", "crdipc-system", "cstorvolumereplicas", "--field-selector", "spec.volume="+volume,
		"-o", "jsonpath={range .items[*]}{.spec.nodeName}{\" \"}{end}")
	nodes := strings.Fields(out)
	sort.Strings(nodes)
	return nodes
}

// replicaFile is the path, on this machine, of volume's replica on node n: the agent
// reports it as seen in the node's mount namespace, where the harness binds n.dir()/crdipc
// on /var/lib/crdipc.
func (c *cluster) replicaFile(t *testing.T, n realNode, volume string) string {
	t.Helper()
	loc := c.kubectl(t, "get", "-n", "crdipc-system", "cstorvolumereplicas",
		"--field-selector", "spec.volume="+volume+",spec.nodeName="+n.name, "-o", "jsonpath={.items[0].status.location}")
	rel, ok := strings.CutPrefix(loc, "/var/lib/crdipc/")
	if !ok {
		t.Fatalf("replica of %s on %s at %q, not under /var/lib/crdipc", volume, n.name, loc)
	}
	return filepath.Join(n.dir(), "crdipc", rel)
}

// allocated is how many bytes of volume's replica file on n hold data (it is sparse).
func (c *cluster) allocated(t *testing.T, n realNode, volume string) int64 {
	t.Helper()
	out := run(t, time.Minute, nil, "stat", "-c", "%b %B", c.replicaFile(t, n, volume))
	var blocks, size int64
	if _, err := fmt.Sscan(out, &blocks, &size); err != nil {
		t.Fatalf("stat: %q: %v", out, err)
	}
	return blocks * size
}

func (c *cluster) replicaSum(t *testing.T, n realNode, volume string) string {
	t.Helper()
	f, err := os.Open(c.replicaFile(t, n, volume))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// testTargetLost: the node that runs the volume's target (where its pod writes) is lost
// mid-write. As on any cluster, the user says the node is gone for good (the out-of-service
// taint): its pod is deleted, the volume detached without waiting for an unmount that will
// never come, and a pod on another node gets it from the freshest replicas, with every write
// acknowledged before the loss. The dead target's sessions on the replicas end when their
// connections are found dead (the replica package's dead-peer settings): it can no longer write (fenced).
func (c *cluster) testTargetLost(t *testing.T, phase func(string)) {
	lost, other := nodeN(3), nodeN(1)
	volume := c.kubectl(t, "get", "pvc", "replicated", "-o", "jsonpath={.spec.volumeName}")
	// Fixed-size records, each written with fsync and then reported: a record reported is
	// one whose write the storage acknowledged.
	c.apply(t, busyboxPod("acker", lost.name, `i=0
while [ $i -lt 1000000 ]; do
  printf 'record %08d\n' $i | dd of=/data/records bs=16 seek=$i count=1 conv=notrunc,fsync 2>/dev/null || exit 1
  echo "acked $i"
  i=$((i+1))
done`))
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Running", "pod/acker")
	acked := c.follow(t, "acker", "acked ")
	c.poll(t, 2*time.Minute, "records acknowledged on real-3", func() (bool, string) {
		n := acked()
		return n >= 100, fmt.Sprintf("%d acknowledged", n)
	})
	phase("a pod on real-3 writing records")
	run(t, time.Minute, nil, "hack/realnode.sh", "kill", "--dir", lost.dir())
	// Reported after each write returned: nothing reported later can come from a dead node.
	last := acked()

	c.wait(t, 2*time.Minute, "--for=condition=Ready=Unknown", "node/"+lost.name)
	c.kubectl(t, "taint", "node", lost.name, "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute")
	c.wait(t, 3*time.Minute, "--for=delete", "pod/acker")
	c.poll(t, 3*time.Minute, "the volume detached from the lost node", func() (bool, string) {
		out := c.kubectl(t, "get", "volumeattachments", "-o", "jsonpath={range .items[*]}{.spec.source.persistentVolumeName}@{.spec.nodeName}{\" \"}{end}")
		return !strings.Contains(out, volume+"@"+lost.name), out
	})
	if n := acked(); n > last {
		last = n
	}
	phase(fmt.Sprintf("real-3 lost after %d acknowledged records; detached", last+1))

	// Every acknowledged record, byte for byte, on real-1.
	size := 16 * (last + 1)
	c.apply(t, busyboxPod("checker", other.name, fmt.Sprintf(`i=0
while [ $i -le %d ]; do printf 'record %%08d\n' $i; i=$((i+1)); done > /tmp/expected
cmp -n %d /data/records /tmp/expected && echo "records 0-%d intact"`, last, size, last)))
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Succeeded", "pod/checker")
	if logs := c.kubectl(t, "logs", "checker"); !strings.Contains(logs, fmt.Sprintf("records 0-%d intact", last)) {
		t.Errorf("checker on real-1: %s", logs)
	}
	c.kubectl(t, "delete", "pod", "checker", "--wait=true")
	phase("real-1 read every acknowledged record")
}

// busyboxPod runs script on node with the claim "replicated" at /data.
func busyboxPod(name, node, script string) string {
	return podWithClaim(name, node, "busybox", "replicated", "sh", "-c", script)
}

// follow streams pod's output (kubectl logs -f) and returns the highest number seen after
// prefix at the start of a line so far (-1 before any).
func (c *cluster) follow(t *testing.T, pod, prefix string) func() int {
	t.Helper()
	return c.followEach(t, pod, prefix)[0]
}

// followEach is follow for several prefixes, from one stream of the pod's output.
func (c *cluster) followEach(t *testing.T, pod string, prefixes ...string) []func() int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "kubectl", "logs", "-f", pod)
	cmd.Env = append(os.Environ(), c.env()...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	highest := make([]int, len(prefixes))
	for i := range highest {
		highest[i] = -1
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			for i, prefix := range prefixes {
				var n int
				if rest, ok := strings.CutPrefix(sc.Text(), prefix); ok {
					if _, err := fmt.Sscan(rest, &n); err == nil {
						mu.Lock()
						highest[i] = max(highest[i], n)
						mu.Unlock()
					}
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		<-done
	})
	get := make([]func() int, len(prefixes))
	for i := range prefixes {
		get[i] = func() int {
			mu.Lock()
			defer mu.Unlock()
			return highest[i]
		}
	}
	return get
}

// testDataPathIdentities: the data path's certificates come through the API, as
// CertificateSigningRequests for crdipc.io/storage-data that the storage operator approved
// for the requester's own node and signed; no node-side account can read the CA's key.
func (c *cluster) testDataPathIdentities(t *testing.T, nodes ...realNode) {
	out := c.kubectl(t, "get", "csr", "-o", `jsonpath={range .items[?(@.spec.signerName=="crdipc.io/storage-data")]}`+
		`{.spec.username}|{.spec.extra.authentication\.kubernetes\.io/node-name[0]}|{.status.conditions[?(@.type=="Approved")].reason}|{.status.certificate}{"\n"}{end}`)
	issued := map[string]int{} // node → signed requests of its own
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 4 {
			continue
		}
		// Approved by the operator (its reason), for the requester's own node.
		if f[2] == "NodeRequestsItsOwnIdentity" && f[3] != "" {
			issued[f[1]]++
		}
	}
	for _, n := range nodes {
		if issued[n.name] == 0 {
			t.Errorf("no approved and signed crdipc.io/storage-data request from node %s; requests (user|node|approval reason|cert):\n%s", n.name, out)
		}
	}
	t.Logf("kubectl get csr (crdipc.io/storage-data):\n%s", c.kubectl(t, "get", "csr", "--sort-by=.metadata.creationTimestamp"))
	for _, sa := range []string{"crdipc-pool-agent", "crdipc-csi-node"} {
		out, _ := runErr(time.Minute, c.env(), "kubectl", "auth", "can-i", "get", "secret/crdipc-storage-data-ca", "-n", "crdipc-system",
			"--as=system:serviceaccount:crdipc-system:"+sa)
		if strings.TrimSpace(out) != "no" {
			t.Errorf("%s may read the data CA's Secret: kubectl auth can-i says %q", sa, out)
		}
	}
	// Nor do the node plugins' pods hold it: they mount no Secret at all.
	vols := c.kubectl(t, "get", "daemonsets", "-n", "crdipc-system", "-o", `jsonpath={range .items[*]}{.metadata.name}:{range .spec.template.spec.volumes[*]}{.secret.secretName}{end}{"\n"}{end}`)
	for _, line := range strings.Fields(vols) {
		if name, secrets, _ := strings.Cut(line, ":"); secrets != "" {
			t.Errorf("daemonset %s mounts the Secret(s) %s", name, secrets)
		}
	}
}

// localReplicaLinks is crdipc_csi_local_replica_connections_total by link and
// crdipc_csi_local_replica_sessions_total by reads ("link:socket", "reads:file", …), from the
// /metrics of the CSI node plugin on node.
func (c *cluster) localReplicaLinks(node string) (map[string]float64, error) {
	ip, err := exec.Command("kubectl", "--kubeconfig", c.kubeconfig, "-n", "crdipc-system", "get", "pods", "-l", "app.kubernetes.io/name=crdipc-csi-node",
		"--field-selector", "spec.nodeName="+node, "-o", "jsonpath={.items[0].status.podIP}").Output()
	if err != nil || len(ip) == 0 {
		return nil, fmt.Errorf("the node plugin's pod IP on %s: %q, %v", node, ip, err)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	res, err := client.Get("http://" + net.JoinHostPort(string(ip), "9808") + "/metrics")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		return nil, err
	}
	links := map[string]float64{}
	for _, name := range []string{"crdipc_csi_local_replica_connections_total", "crdipc_csi_local_replica_sessions_total"} {
		for _, m := range mfs[name].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "link" || l.GetName() == "reads" {
					links[l.GetName()+":"+l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return links, nil
}
