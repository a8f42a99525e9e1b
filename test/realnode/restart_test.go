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

// testPluginRestarts: a pod on real-1 appends records to a claim, each with fsync, and
// stops at the first failed write. Its node's CSI node plugin is restarted the way an
// upgrade does it (kubectl rollout restart), then SIGKILLed; the fd holder keeps the
// volume's FUSE connection meanwhile, and each new plugin process takes the volume over.
// The writer never fails, its records go on after each, and a pod on another node reads
// every acknowledged record back. The claim has one replica (testVolume's class), wherever
// it was placed: what restarts is the target on real-1, not the replica.
func (c *cluster) testPluginRestarts(t *testing.T, phase func(string)) {
	on, other := nodeN(1), nodeN(3)
	c.apply(t, `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: restarts, namespace: default}
spec:
  storageClassName: crdipc-one
  accessModes: ["ReadWriteOnce"]
  resources: {requests: {storage: 64Mi}}
`)
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Bound", "pvc/restarts")
	// The time of each acknowledgement, to measure the pauses.
	c.apply(t, podWithClaim("restart-writer", on.name, "busybox", "restarts", "sh", "-c", `i=0
while [ $i -lt 1000000 ]; do
  printf 'record %08d\n' $i | dd of=/data/records bs=16 seek=$i count=1 conv=notrunc,fsync 2>/dev/null || { echo "failed $i"; exit 1; }
  echo "acked $i $(date +%s%N)"
  i=$((i+1))
done`))
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Running", "pod/restart-writer")
	acked := c.follow(t, "restart-writer", "acked ")
	goOn := func(what string, more int) {
		t.Helper()
		from := acked()
		c.poll(t, 3*time.Minute, fmt.Sprintf("%d more records after %s", more, what), func() (bool, string) {
			if p := c.kubectl(t, "get", "pod", "restart-writer", "-o", "jsonpath={.status.phase}"); p != "Running" {
				t.Fatalf("the writer is %s after %s: %s", p, what, tail(c.kubectl(t, "logs", "restart-writer"), 5))
			}
			n := acked()
			return n >= from+more, fmt.Sprintf("%d acknowledged", n)
		})
	}
	goOn("the start", 50)
	phase("a pod on real-1 writing records")

	c.kubectl(t, "-n", "crdipc-system", "rollout", "restart", "daemonset/crdipc-csi-node")
	if out, err := runErr(5*time.Minute, c.env(), "kubectl", "-n", "crdipc-system", "rollout", "status", "daemonset/crdipc-csi-node", "--timeout=5m"); err != nil {
		t.Fatalf("rollout: %v\n%s\n%s", err, out, c.describe())
	}
	goOn("the rollout", 50)
	rollout := c.longestPause(t)
	phase(fmt.Sprintf("node plugins rolled; the writer's longest pause %s", rollout))

	pid := pluginPID(t, on)
	restarts := c.pluginRestarts(t, on)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL the node plugin of %s (pid %d): %v", on.name, pid, err)
	}
	c.poll(t, 3*time.Minute, "the killed plugin's container restarted", func() (bool, string) {
		n := c.pluginRestarts(t, on)
		return n > restarts, fmt.Sprintf("%d restarts", n)
	})
	goOn("the SIGKILL", 50)
	killed := c.longestPause(t)
	phase(fmt.Sprintf("node plugin of real-1 SIGKILLed; the writer's longest pause %s", killed))

	c.kubectl(t, "delete", "pod", "restart-writer", "--wait=true")
	last := acked()
	c.apply(t, podWithClaim("restart-reader", other.name, "busybox", "restarts", "sh", "-c", fmt.Sprintf(`i=0
while [ $i -le %d ]; do printf 'record %%08d\n' $i; i=$((i+1)); done > /tmp/expected
cmp -n %d /data/records /tmp/expected && echo "records 0-%d intact"`, last, 16*(last+1), last)))
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Succeeded", "pod/restart-reader")
	if logs := c.kubectl(t, "logs", "restart-reader"); !strings.Contains(logs, fmt.Sprintf("records 0-%d intact", last)) {
		t.Errorf("reader on %s: %s", other.name, logs)
	}
	c.kubectl(t, "delete", "pod", "restart-reader", "--wait=true")
	c.kubectl(t, "delete", "pvc", "restarts", "--wait=true")
	t.Logf("%d records through a rollout (longest pause %s) and a SIGKILL (longest pause %s) of the node plugin", last+1, rollout, killed)
}

// longestPause is the longest time between two acknowledgements in the writer's log.
func (c *cluster) longestPause(t *testing.T) time.Duration {
	t.Helper()
	var longest time.Duration
	var prev int64
	for _, line := range strings.Split(c.kubectl(t, "logs", "restart-writer"), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "acked" {
			continue
		}
		ns, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			continue
		}
		if prev != 0 {
			longest = max(longest, time.Duration(ns-prev))
		}
		prev = ns
	}
	return longest
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
