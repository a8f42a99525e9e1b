package realnode

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/storage/fdstore"
)

// testRestarts: a pod on real-1 appends records to a 3-replica claim, each with fsync, and
// stops at the first failed write. Every crdipc DaemonSet and Deployment is restarted in
// turn as an upgrade restarts them (kubectl rollout restart): the pool agents (the
// replicas' servers, one node at a time) and the CSI node plugins (the writer's target)
// among them; then real-1's node plugin is SIGKILLed from the host, then its fd holder, the
// node plugins roll once more, and real-1's new plugin is SIGSTOPped (hung: its liveness
// probe has it restarted). The fd holder keeps the volume's FUSE connection while no plugin serves
// it, each new plugin process takes the volume over, and a restarted holder is given the
// connection again by the plugin. The writer never fails, its records go on after each step (the longest pause
// of each is logged), and the volume is Healthy with 3 replicas at the end. Then real-1 is
// drained: the writer goes, the volume detaches, and a pod on another node reads every
// acknowledged record back.
func (c *cluster) testRestarts(t *testing.T, phase func(string)) {
	on, other := nodeN(1), nodeN(3)
	volume := c.threeReplicaClaim(t, "restarts", "64Mi")
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
		c.rollout(t, w, wl.ns, wl.name, phase)
	}

	c.killPlugin(t, w, on, phase)

	// The fd holder SIGKILLed: the volume's I/O goes on (the plugin serves it), and the plugin
	// gives the restarted holder the connection again; then the plugin is replaced (a rollout:
	// a second SIGKILL this soon would wait out the kubelet's restart back-off), and the new
	// one takes the volume over from the new holder's descriptor.
	from := w.acked()
	c.killRestarted(t, on, "crdipc-fd-holder", "fd-holder")
	holder := &fdstore.Client{Path: filepath.Join(on.dir(), "crdipc-fd-holder", "fd.sock")}
	c.poll(t, time.Minute, "the restarted fd holder given the volume's connection again", func() (bool, string) {
		names, err := holder.List()
		if err != nil {
			return false, err.Error()
		}
		return slices.ContainsFunc(names, func(n string) bool { return strings.Contains(n, volume) }), fmt.Sprint(names)
	})
	w.goOn(t, "the fd holder's SIGKILL", 20)
	phase(fmt.Sprintf("fd holder of real-1 SIGKILLed; the writer's longest pause %s", w.longestPause(t, from)))
	c.rollout(t, w, "crdipc-system", "daemonset/crdipc-csi-node", phase)
	// After the rollout: the new pod's first restart comes without the kubelet's back-off.
	c.stopPlugin(t, w, on, phase)
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

// rollout restarts workload name (kind/name) in ns as an upgrade does, and waits for it to
// roll out and for the writer to go on.
func (c *cluster) rollout(t *testing.T, w *recordWriter, ns, name string, phase func(string)) {
	t.Helper()
	from := w.acked()
	c.kubectl(t, "-n", ns, "rollout", "restart", name)
	if out, err := runErr(6*time.Minute, c.env(), "kubectl", "-n", ns, "rollout", "status", name, "--timeout=6m"); err != nil {
		t.Fatalf("rollout of %s: %v\n%s\n%s", name, err, out, c.describe())
	}
	if ds, ok := strings.CutPrefix(name, "daemonset/"); ok {
		// With a surge the old pod of a node goes once the new one is Ready: what follows
		// (kill, restarts) finds one pod per node.
		c.poll(t, time.Minute, "the old pods of "+name+" gone", func() (bool, string) {
			out := c.kubectl(t, "get", "pods", "-n", ns, "-l", "app.kubernetes.io/name="+ds, "-o", "jsonpath={.items[*].metadata.deletionTimestamp}")
			return strings.TrimSpace(out) == "", "terminating since " + out
		})
	}
	w.goOn(t, "the rollout of "+name, 20)
	phase(fmt.Sprintf("%s rolled; the writer's longest pause %s", name, w.longestPause(t, from)))
}

// killPlugin SIGKILLs node n's CSI node plugin, the writer's target, and waits for the
// kubelet to restart it and for the writer to go on.
func (c *cluster) killPlugin(t *testing.T, w *recordWriter, n realNode, phase func(string)) {
	t.Helper()
	from := w.acked()
	c.killRestarted(t, n, "crdipc-csi-node", "csi-driver")
	w.goOn(t, "the SIGKILL", 50)
	phase(fmt.Sprintf("node plugin of %s SIGKILLed; the writer's longest pause %s", n.name, w.longestPause(t, from)))
}

// hungPluginBound is how long a hung node plugin may pause its volumes' I/O: the liveness
// probe's three failures 5 s apart with a 3 s timeout (18 s), the probe's 5 s grace period,
// the restart and the takeover. config/csi/node.yaml's probe is chosen for it.
const hungPluginBound = 60 * time.Second

// stopPlugin SIGSTOPs node n's CSI node plugin, the writer's target: a hung process, which
// neither serves nor dies. The liveness probe fails, the kubelet kills and restarts it, the
// new process takes the volume over from the fd holder; the writer pauses at most
// hungPluginBound and no write fails.
func (c *cluster) stopPlugin(t *testing.T, w *recordWriter, n realNode, phase func(string)) {
	t.Helper()
	from := w.acked()
	c.signalRestarted(t, n, "crdipc-csi-node", "csi-driver", syscall.SIGSTOP)
	w.goOn(t, "the SIGSTOP", 50)
	w.noFailure(t)
	pause := w.longestPause(t, from)
	if pause > hungPluginBound {
		t.Errorf("a SIGSTOPped node plugin paused the writer %s, more than %s", pause, hungPluginBound)
	}
	phase(fmt.Sprintf("node plugin of %s SIGSTOPped (hung) and restarted by its liveness probe; the writer's longest pause %s", n.name, pause))
}

// killRestarted kills app's process subcommand on node n and waits for the kubelet to
// restart its container.
func (c *cluster) killRestarted(t *testing.T, n realNode, app, subcommand string) {
	t.Helper()
	c.signalRestarted(t, n, app, subcommand, syscall.SIGKILL)
}

// signalRestarted sends sig to app's process subcommand on node n and waits for the kubelet
// to restart its container.
func (c *cluster) signalRestarted(t *testing.T, n realNode, app, subcommand string, sig syscall.Signal) {
	t.Helper()
	restarts := c.restarts(t, n, app)
	c.signal(t, n, app, subcommand, sig)
	c.poll(t, 3*time.Minute, "the killed "+app+" container restarted", func() (bool, string) {
		r := c.restarts(t, n, app)
		return r > restarts, fmt.Sprintf("%d restarts", r)
	})
}

// signal sends sig, from this machine, where the real nodes' processes run, to the crdipc
// process that runs subcommand in app's pod on node n (app: the label app.kubernetes.io/name
// of a DaemonSet's pods): the one whose cgroup is the pod's.
func (c *cluster) signal(t *testing.T, n realNode, app, subcommand string, sig syscall.Signal) {
	t.Helper()
	uid := c.kubectl(t, "get", "pods", "-n", "crdipc-system", "-l", "app.kubernetes.io/name="+app,
		"--field-selector", "spec.nodeName="+n.name, "-o", "jsonpath={.items[*].metadata.uid}")
	if uid == "" || strings.Contains(uid, " ") {
		t.Fatalf("pods of %s on %s: %q, want one", app, n.name, uid)
	}
	// The kubelet's cgroup names carry the UID as it is (cgroupfs) or with underscores (systemd).
	forms := []string{uid, strings.ReplaceAll(uid, "-", "_")}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var found []int
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) < 2 || !strings.HasSuffix(args[0], "crdipc") || args[1] != subcommand {
			continue
		}
		cg, err := os.ReadFile(filepath.Join(filepath.Dir(p), "cgroup"))
		if err == nil && slices.ContainsFunc(forms, func(f string) bool { return strings.Contains(string(cg), f) }) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			found = append(found, pid)
		}
	}
	if len(found) != 1 {
		t.Fatalf("crdipc %s processes of pod %s (%s on %s): %v, want one", subcommand, uid, app, n.name, found)
	}
	if err := syscall.Kill(found[0], sig); err != nil {
		t.Fatalf("%s to crdipc %s of %s (pid %d): %v", sig, subcommand, n.name, found[0], err)
	}
}

// restarts is the restart count of the first container of app's pod on node n (app: the
// label app.kubernetes.io/name of a DaemonSet's pods).
func (c *cluster) restarts(t *testing.T, n realNode, app string) int {
	t.Helper()
	out := c.kubectl(t, "get", "pods", "-n", "crdipc-system", "-l", "app.kubernetes.io/name="+app,
		"--field-selector", "spec.nodeName="+n.name, "-o", "jsonpath={.items[*].status.containerStatuses[0].restartCount}")
	r, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("restart count of %s's %s: %q", n.name, app, out)
	}
	return r
}
