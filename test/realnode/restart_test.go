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
	volume := c.threeReplicaClaim(t, "restarts")
	w := c.startWriter(t, "restart-writer", "restarts", on)
	w.goOn(t, "the start", 50)
	phase("a pod on real-1 writing records to a 3-replica volume")

	for _, wl := range []struct{ ns, name string }{
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
		from := w.acked()
		c.kubectl(t, "-n", wl.ns, "rollout", "restart", wl.name)
		if out, err := runErr(6*time.Minute, c.env(), "kubectl", "-n", wl.ns, "rollout", "status", wl.name, "--timeout=6m"); err != nil {
			t.Fatalf("rollout of %s: %v\n%s\n%s", wl.name, err, out, c.describe())
		}
		w.goOn(t, "the rollout of "+wl.name, 20)
		phase(fmt.Sprintf("%s rolled; the writer's longest pause %s", wl.name, w.longestPause(t, from)))
	}

	pid := pluginPID(t, on)
	restarts := c.pluginRestarts(t, on)
	from := w.acked()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL the node plugin of %s (pid %d): %v", on.name, pid, err)
	}
	c.poll(t, 3*time.Minute, "the killed plugin's container restarted", func() (bool, string) {
		n := c.pluginRestarts(t, on)
		return n > restarts, fmt.Sprintf("%d restarts", n)
	})
	w.goOn(t, "the SIGKILL", 50)
	phase(fmt.Sprintf("node plugin of real-1 SIGKILLed; the writer's longest pause %s", w.longestPause(t, from)))
	c.volumeHealthy(t, volume, "after the restarts")

	// Drained, real-1 gives up the writer (evicted; --force: a bare pod) and crdipc's own
	// pods there, one replica of each Deployment at a time (their PodDisruptionBudgets);
	// the volume detaches from real-1, and a pod on another node gets it with every record.
	t.Cleanup(func() { c.kubectl(t, "uncordon", on.name) })
	c.drain(t, on, volume)
	last := w.acked()
	w.noFailure(t)
	phase(fmt.Sprintf("%s drained after %d records; the volume detached", on.name, last+1))
	c.readBack(t, "restart-reader", "restarts", other, last)
	c.kubectl(t, "delete", "pvc", "restarts", "--wait=true")
	c.kubectl(t, "uncordon", on.name)
	phase(fmt.Sprintf("%d records read back on %s", last+1, other.name))
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
