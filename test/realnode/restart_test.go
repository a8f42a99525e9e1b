package realnode

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testRestarts: a pod on real-1 appends records to a 3-replica claim, each with fsync, and
// stops at the first failed write. Every crdipc DaemonSet and Deployment is restarted in
// turn as an upgrade restarts them (kubectl rollout restart): the pool agents (the
// replicas' servers, one node at a time) and the CSI node plugins (the writer's target)
// among them; then real-1's node plugin is SIGKILLed from the host. The fd holder keeps the
// volume's FUSE connection while no plugin serves it, and each new plugin process takes the
// volume over. The writer never fails, its records go on after each step (the longest pause
// of each is logged), and the volume is Healthy with 3 replicas at the end. Then real-1 is
// drained: the writer goes, the volume detaches, and a pod on another node reads every
// acknowledged record back.
func (c *cluster) testRestarts(t *testing.T, phase func(string)) {
	on, other := nodeN(1), nodeN(3)
	c.apply(t, `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: restarts, namespace: default}
spec:
  storageClassName: crdipc
  accessModes: ["ReadWriteOnce"]
  resources: {requests: {storage: 64Mi}}
`)
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Bound", "pvc/restarts")
	volume := c.kubectl(t, "get", "pvc", "restarts", "-o", "jsonpath={.spec.volumeName}")
	healthy := func(what string) {
		t.Helper()
		c.poll(t, 5*time.Minute, "volume "+volume+" Healthy with 3 replicas "+what, func() (bool, string) {
			out := c.kubectl(t, "get", "cstorvolume", "-n", "crdipc-system", volume, "-o", "jsonpath={.status.phase} {.status.readyReplicas}")
			return out == "Healthy 3", out
		})
	}
	healthy("at the start")
	// Each acknowledgement with the time since boot (busybox's date has no %N; 10 ms
	// resolution), to measure the pauses.
	c.apply(t, podWithClaim("restart-writer", on.name, "busybox", "restarts", "sh", "-c", `i=0
while [ $i -lt 1000000 ]; do
  printf 'record %08d\n' $i | dd of=/data/records bs=16 seek=$i count=1 conv=notrunc,fsync 2>/dev/null || { echo "failed $i"; exit 1; }
  read up _ < /proc/uptime
  echo "acked $i $up"
  i=$((i+1))
done`))
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Running", "pod/restart-writer")
	acked := c.follow(t, "restart-writer", "acked ")
	goOn := func(what string, more int) {
		t.Helper()
		from := acked()
		c.poll(t, 5*time.Minute, fmt.Sprintf("%d more records after %s", more, what), func() (bool, string) {
			if p := c.kubectl(t, "get", "pod", "restart-writer", "-o", "jsonpath={.status.phase}"); p != "Running" {
				t.Fatalf("the writer is %s after %s: %s", p, what, tail(c.kubectl(t, "logs", "restart-writer"), 5))
			}
			n := acked()
			return n >= from+more, fmt.Sprintf("%d acknowledged", n)
		})
	}
	goOn("the start", 50)
	phase("a pod on real-1 writing records to a 3-replica volume")

	for _, w := range []struct{ ns, name string }{
		{"crdipc-system", "daemonset/crdipc-pool-agent"},
		{"crdipc-system", "daemonset/crdipc-csi-node"},
		{"crdipc-system", "deployment/crdipc-storage-operator"},
		{"crdipc-system", "deployment/crdipc-csi-controller"},
		{"crdipc-system", "deployment/crdipc-snapshot-controller"},
		{"crdipc-system", "deployment/crdipc-books"},
		{"crdipc-system", "deployment/crdipc-bitcoin-operator"},
		{"crdipc-scm", "deployment/crdipc-webhook-listener"},
		{"crdipc-scm", "deployment/crdipc-metrics-agent"},
	} {
		from := acked()
		c.kubectl(t, "-n", w.ns, "rollout", "restart", w.name)
		if out, err := runErr(6*time.Minute, c.env(), "kubectl", "-n", w.ns, "rollout", "status", w.name, "--timeout=6m"); err != nil {
			t.Fatalf("rollout of %s: %v\n%s\n%s", w.name, err, out, c.describe())
		}
		goOn("the rollout of "+w.name, 20)
		phase(fmt.Sprintf("%s rolled; the writer's longest pause %s", w.name, c.longestPause(t, from)))
	}

	pid := pluginPID(t, on)
	restarts := c.pluginRestarts(t, on)
	from := acked()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL the node plugin of %s (pid %d): %v", on.name, pid, err)
	}
	c.poll(t, 3*time.Minute, "the killed plugin's container restarted", func() (bool, string) {
		n := c.pluginRestarts(t, on)
		return n > restarts, fmt.Sprintf("%d restarts", n)
	})
	goOn("the SIGKILL", 50)
	phase(fmt.Sprintf("node plugin of real-1 SIGKILLed; the writer's longest pause %s", c.longestPause(t, from)))
	healthy("after the restarts")

	// Drained, real-1 gives up the writer (evicted; --force: a bare pod) and crdipc's own
	// pods there, one replica of each Deployment at a time (their PodDisruptionBudgets);
	// the volume detaches from real-1, and a pod on another node gets it with every record.
	if out, err := runErr(6*time.Minute, c.env(), "kubectl", "drain", on.name, "--ignore-daemonsets", "--force", "--delete-emptydir-data", "--timeout=5m"); err != nil {
		t.Fatalf("kubectl drain %s: %v\n%s\n%s", on.name, err, out, c.describe())
	}
	t.Cleanup(func() { c.kubectl(t, "uncordon", on.name) })
	c.poll(t, 3*time.Minute, "the volume detached from "+on.name, func() (bool, string) {
		out := c.kubectl(t, "get", "volumeattachments", "-o", "jsonpath={range .items[*]}{.spec.source.persistentVolumeName}@{.spec.nodeName}{\" \"}{end}")
		return !strings.Contains(out, volume+"@"+on.name), out
	})
	last := acked()
	phase(fmt.Sprintf("%s drained after %d records; the volume detached", on.name, last+1))
	c.apply(t, podWithClaim("restart-reader", other.name, "busybox", "restarts", "sh", "-c", fmt.Sprintf(`i=0
while [ $i -le %d ]; do printf 'record %%08d\n' $i; i=$((i+1)); done > /tmp/expected
cmp -n %d /data/records /tmp/expected && echo "records 0-%d intact"`, last, 16*(last+1), last)))
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Succeeded", "pod/restart-reader")
	if logs := c.kubectl(t, "logs", "restart-reader"); !strings.Contains(logs, fmt.Sprintf("records 0-%d intact", last)) {
		t.Errorf("reader on %s: %s", other.name, logs)
	}
	c.kubectl(t, "delete", "pod", "restart-reader", "--wait=true")
	c.kubectl(t, "delete", "pvc", "restarts", "--wait=true")
	c.kubectl(t, "uncordon", on.name)
	phase(fmt.Sprintf("%d records read back on %s", last+1, other.name))
}

// longestPause is the longest time between two acknowledgements in the writer's log, of
// those from record from on.
func (c *cluster) longestPause(t *testing.T, from int) time.Duration {
	t.Helper()
	var longest time.Duration
	prev := -1.0
	for _, line := range strings.Split(c.kubectl(t, "logs", "restart-writer"), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "acked" {
			continue
		}
		i, err1 := strconv.Atoi(f[1])
		at, err2 := strconv.ParseFloat(f[2], 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if prev >= 0 && i > from {
			longest = max(longest, time.Duration((at-prev)*float64(time.Second)))
		}
		prev = at
	}
	return longest.Round(10 * time.Millisecond)
}

// pluginPID is the process of node n's CSI node plugin (its container's crdipc csi-driver),
// found on this machine, where the real node's processes run.
func pluginPID(t *testing.T, n realNode) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var found []int
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) > 2 && strings.HasSuffix(args[0], "crdipc") && args[1] == "csi-driver" && strings.Contains(string(b), "--node-id="+n.name+"\x00") {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			found = append(found, pid)
		}
	}
	if len(found) != 1 {
		t.Fatalf("node plugin processes of %s: %v, want one", n.name, found)
	}
	return found[0]
}

// pluginRestarts is the restart count of node n's node plugin container.
func (c *cluster) pluginRestarts(t *testing.T, n realNode) int {
	t.Helper()
	out := c.kubectl(t, "get", "pods", "-n", "crdipc-system", "-l", "app.kubernetes.io/name=crdipc-csi-node",
		"--field-selector", "spec.nodeName="+n.name, "-o", "jsonpath={.items[*].status.containerStatuses[0].restartCount}")
	r, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("restart count of %s's node plugin: %q", n.name, out)
	}
	return r
}
