package realnode

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// recordWriter is a pod that appends 16-byte records to a claim, each with fsync, and stops
// at the first failed write. It logs each acknowledgement with the time since boot
// (busybox's date has no %N; 10 ms resolution), to measure the pauses.
type recordWriter struct {
	c      *cluster
	pod    string
	acked  func() int // the highest record acknowledged so far (-1 before any)
	failed func() int // the record whose write failed (-1: none)
}

func (c *cluster) startWriter(t *testing.T, pod, claim string, on realNode) *recordWriter {
	t.Helper()
	c.apply(t, podWithClaim(pod, on.name, "busybox", claim, "sh", "-c", `i=0
while [ $i -lt 1000000 ]; do
  printf 'record %08d\n' $i | dd of=/data/records bs=16 seek=$i count=1 conv=notrunc,fsync 2>/dev/null || { echo "failed $i"; exit 1; }
  read up _ < /proc/uptime
  echo "acked $i $up"
  i=$((i+1))
done`))
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Running", "pod/"+pod)
	seen := c.followEach(t, pod, "acked ", "failed ")
	return &recordWriter{c: c, pod: pod, acked: seen[0], failed: seen[1]}
}

// noFailure fails the test if a write failed, also once the pod is gone (its log was
// followed while it ran).
func (w *recordWriter) noFailure(t *testing.T) {
	t.Helper()
	if n := w.failed(); n >= 0 {
		t.Fatalf("the writer's record %d failed (%d acknowledged)", n, w.acked()+1)
	}
}

// goOn waits for more records acknowledged after what happened, failing if the writer stops.
func (w *recordWriter) goOn(t *testing.T, what string, more int) {
	t.Helper()
	from := w.acked()
	w.c.poll(t, 5*time.Minute, fmt.Sprintf("%d more records after %s", more, what), func() (bool, string) {
		if p := w.c.kubectl(t, "get", "pod", w.pod, "-o", "jsonpath={.status.phase}"); p != "Running" {
			t.Fatalf("the writer is %s after %s: %s", p, what, tail(w.c.kubectl(t, "logs", w.pod), 5))
		}
		n := w.acked()
		return n >= from+more, fmt.Sprintf("%d acknowledged", n)
	})
}

// longestPause is the longest time between two acknowledgements in the writer's log, of
// those from record from on.
func (w *recordWriter) longestPause(t *testing.T, from int) time.Duration {
	t.Helper()
	var longest time.Duration
	prev := -1.0
	for _, line := range strings.Split(w.c.kubectl(t, "logs", w.pod), "\n") {
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

// readBack has a pod on n compare records 0 to last of claim with what the writer wrote.
func (c *cluster) readBack(t *testing.T, pod, claim string, n realNode, last int) {
	t.Helper()
	c.apply(t, podWithClaim(pod, n.name, "busybox", claim, "sh", "-c", fmt.Sprintf(`i=0
while [ $i -le %d ]; do printf 'record %%08d\n' $i; i=$((i+1)); done > /tmp/expected
cmp -n %d /data/records /tmp/expected && echo "records 0-%d intact"`, last, 16*(last+1), last)))
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Succeeded", "pod/"+pod)
	if logs := c.kubectl(t, "logs", pod); !strings.Contains(logs, fmt.Sprintf("records 0-%d intact", last)) {
		t.Errorf("reader on %s: %s", n.name, logs)
	}
	c.kubectl(t, "delete", "pod", pod, "--wait=true")
}

// drain drains node n as an operator does (bare pods too, --force), and waits until no
// VolumeAttachment of volume names it.
func (c *cluster) drain(t *testing.T, n realNode, volume string) {
	t.Helper()
	if out, err := runErr(6*time.Minute, c.env(), "kubectl", "drain", n.name, "--ignore-daemonsets", "--force", "--delete-emptydir-data", "--timeout=5m"); err != nil {
		t.Fatalf("kubectl drain %s: %v\n%s\n%s", n.name, err, out, c.describe())
	}
	c.poll(t, 3*time.Minute, "the volume detached from "+n.name, func() (bool, string) {
		out := c.kubectl(t, "get", "volumeattachments", "-o", "jsonpath={range .items[*]}{.spec.source.persistentVolumeName}@{.spec.nodeName}{\" \"}{end}")
		return !strings.Contains(out, volume+"@"+n.name), out
	})
}

// volumeHealthy waits for the claim's volume to be Healthy with 3 replicas.
func (c *cluster) volumeHealthy(t *testing.T, volume, what string) {
	t.Helper()
	c.poll(t, 5*time.Minute, "volume "+volume+" Healthy with 3 replicas "+what, func() (bool, string) {
		out := c.kubectl(t, "get", "cstorvolume", "-n", "crdipc-system", volume, "-o", "jsonpath={.status.phase} {.status.readyReplicas}")
		return out == "Healthy 3", out
	})
}

// threeReplicaClaim creates a claim of size of the StorageClass crdipc (3 replicas), Bound
// and Healthy, and returns its volume's name.
func (c *cluster) threeReplicaClaim(t *testing.T, name, size string) string {
	t.Helper()
	c.apply(t, fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %s, namespace: default}
spec:
  storageClassName: crdipc
  accessModes: ["ReadWriteOnce"]
  resources: {requests: {storage: %s}}
`, name, size))
	c.wait(t, 3*time.Minute, "--for=jsonpath={.status.phase}=Bound", "pvc/"+name)
	volume := c.kubectl(t, "get", "pvc", name, "-o", "jsonpath={.spec.volumeName}")
	c.volumeHealthy(t, volume, "at the start")
	return volume
}
