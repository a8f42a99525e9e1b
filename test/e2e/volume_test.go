package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/bitcoin/btcd"
	"github.com/crdipc/crdipc/internal/storage/blockdev"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// TestReplicatedVolume is the storage data path as a user meets it on `crdipc up --nodes 3`:
// a PVC of StorageClass crdipc and a busybox pod that writes a file to it; once the pod is
// gone the three replica files under the data dir are byte-identical and hold the data; a
// replica's Node is deleted and another added: the volume goes Degraded, then Healthy with a
// rebuilt replica, byte-identical again; a pod on another node reads the file back intact.
func TestReplicatedVolume(t *testing.T) {
	requireKubectl(t)
	require(t, "CRDIPC_REQUIRE_MOUNT", blockdev.Available())
	dataDir := t.TempDir()
	up := startUp(t, dataDir, "--nodes", "3")
	up.kubectl(t, "apply", "-f", "../../config/samples/csi/storage_v1alpha1_storagepoolclaim.yaml")
	up.kubectl(t, "apply", "-f", "../../config/samples/csi/pvc.yaml")
	up.kubectl(t, "wait", "--for=jsonpath={.status.phase}=Bound", "pvc/data", "--timeout=60s")
	volume := up.kubectl(t, "get", "pvc", "data", "-o", "jsonpath={.spec.volumeName}")

	// A random line, so the replica files can be searched for it.
	marker := fmt.Sprintf("crdipc-e2e-%d", time.Now().UnixNano())
	sum := sha256.Sum256([]byte(marker + "\n"))
	want := hex.EncodeToString(sum[:])
	up.apply(t, busyboxPod("writer", "node-1", fmt.Sprintf(
		"echo %s > /data/hello && sync && sha256sum /data/hello | cut -d' ' -f1 > /data/hello.sha256 && sync", marker)))
	up.waitPodSucceeded(t, "writer")
	up.kubectl(t, "delete", "pod", "writer", "--wait=true", "--timeout=60s")

	// Unstaged: the replicas were closed cleanly, identical, holding the line.
	up.eventually(t, time.Minute, "three identical replica files holding the data", up.replicasIdentical(t, volume, 3, marker))

	// A replica's node goes; another joins.
	var gone string
	for _, n := range strings.Fields(up.kubectl(t, "get", "cv", "-n", "crdipc-system", volume, "-o", "jsonpath={.status.replicas[*].node}")) {
		if n != "node-1" {
			gone = n
		}
	}
	if gone == "" {
		t.Fatalf("volume %s has no replica off node-1", volume)
	}
	up.kubectl(t, "delete", "node", gone)
	up.eventually(t, time.Minute, "the volume Degraded", func(context.Context) (bool, error) {
		if phase := up.kubectl(t, "get", "cv", "-n", "crdipc-system", volume, "-o", "jsonpath={.status.phase}"); phase != "Degraded" {
			return false, fmt.Errorf("phase %q", phase)
		}
		return true, nil
	})
	up.kubectl(t, "apply", "-f", "../../test/testdata/node-4.yaml") // as the README says
	up.eventually(t, 2*time.Minute, "the volume Healthy with a replica on node-4", func(context.Context) (bool, error) {
		out := up.kubectl(t, "get", "cv", "-n", "crdipc-system", volume, "-o", `jsonpath={.status.phase} {.status.replicas[*].node}`)
		if !strings.HasPrefix(out, "Healthy ") || !strings.Contains(out, "node-4") {
			return false, fmt.Errorf("phase and replica nodes: %s", out)
		}
		return true, nil
	})
	up.eventually(t, time.Minute, "three identical replica files after the rebuild", up.replicasIdentical(t, volume, 3, marker))

	// Another node reads the file back.
	reader := "node-4"
	up.apply(t, busyboxPod("reader", reader, fmt.Sprintf(
		"test \"$(cat /data/hello)\" = %s && test \"$(sha256sum /data/hello | cut -d' ' -f1)\" = \"$(cat /data/hello.sha256)\" && test \"$(cat /data/hello.sha256)\" = %s", marker, want)))
	up.waitPodSucceeded(t, "reader")

	// A BitcoinNetwork keeps its chain on a claim of the same class: btcd runs with its
	// datadir on the replicated volume.
	_, err := (btcd.Image{}).Find()
	require(t, "CRDIPC_REQUIRE_BTCD", err)
	up.apply(t, "apiVersion: bitcoin.crdipc.io/v1alpha1\nkind: BitcoinNetwork\nmetadata:\n  name: kept\n  namespace: default\n"+
		"spec:\n  nodes: 1\n  storage:\n    storageClassName: crdipc\n    size: 64Mi\n")
	up.kubectl(t, "wait", "--for=condition=Ready", "bitcoinnetwork/kept", "--timeout=120s")
	if phase := up.kubectl(t, "get", "pvc", "data-kept-0", "-o", "jsonpath={.status.phase}"); phase != "Bound" {
		t.Fatalf("the network's claim data-kept-0 is %q, want Bound", phase)
	}
	mounts := up.kubectl(t, "get", "pod", "kept-0", "-o", "jsonpath={.spec.volumes[?(@.name==\"data\")].persistentVolumeClaim.claimName}")
	if mounts != "data-kept-0" {
		t.Fatalf("pod kept-0 mounts %q at /data, want claim data-kept-0", mounts)
	}
}

// busyboxPod is a pod on node that runs script with the PVC data mounted at /data.
func busyboxPod(name, node, script string) string {
	pod := map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": "default"},
		"spec": map[string]any{
			"nodeSelector":  map[string]string{"kubernetes.io/hostname": node},
			"restartPolicy": "Never",
			"containers": []any{map[string]any{
				"name": "main", "image": "busybox:1.36",
				"command":      []string{"sh", "-c", script},
				"volumeMounts": []any{map[string]any{"name": "data", "mountPath": "/data"}},
			}},
			"volumes": []any{map[string]any{"name": "data", "persistentVolumeClaim": map[string]any{"claimName": "data"}}},
		},
	}
	b, _ := json.Marshal(pod)
	return string(b)
}

// apply is kubectl apply -f - of manifest.
func (p *upProcess) apply(t *testing.T, manifest string) {
	t.Helper()
	cmd := exec.Command("kubectl", "apply", "-f", "-")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+p.kubeconfig)
	cmd.Stdin = strings.NewReader(manifest)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v\n%s\n%s", err, out, manifest)
	}
}

// eventually is testenv.Eventually that also shows up's output when the wait fails.
func (p *upProcess) eventually(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	if err := wait.Until(context.Background(), timeout, cond); err != nil {
		t.Fatalf("%s: %v\nup's output:\n%s", what, err, p.output.String())
	}
}

// waitPodSucceeded waits for pod name to succeed, failing at once if it fails.
func (p *upProcess) waitPodSucceeded(t *testing.T, name string) {
	t.Helper()
	p.eventually(t, 2*time.Minute, "pod "+name+" Succeeded", func(context.Context) (bool, error) {
		phase := p.kubectl(t, "get", "pod", name, "-o", "jsonpath={.status.phase}")
		if phase == "Failed" {
			t.Fatalf("pod %s failed:\n%s", name, p.kubectl(t, "get", "pod", name, "-o", "yaml"))
		}
		if phase != "Succeeded" {
			return false, fmt.Errorf("phase %q, container %s", phase, p.kubectl(t, "get", "pod", name, "-o", "jsonpath={.status.containerStatuses[0].state}"))
		}
		return true, nil
	})
}

// replicasIdentical holds when volume reports n replica files (each replica's absolute
// path, from its status.replicas[*].location), all with the same bytes, holding marker.
func (p *upProcess) replicasIdentical(t *testing.T, volume string, n int, marker string) func(context.Context) (bool, error) {
	return func(context.Context) (bool, error) {
		out := p.kubectl(t, "get", "cv", "-n", "crdipc-system", volume, "-o", `jsonpath={range .status.replicas[*]}{.location}{" "}{end}`)
		files := strings.Fields(out)
		if len(files) != n {
			replicas := p.kubectl(t, "get", "cv", "-n", "crdipc-system", volume, "-o", "jsonpath={.status.replicas}")
			return false, fmt.Errorf("%d replica locations, want %d: %s", len(files), n, replicas)
		}
		sums := map[string][]string{}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				return false, err
			}
			if !bytes.Contains(data, []byte(marker)) {
				return false, fmt.Errorf("%s does not hold the data", f)
			}
			s := sha256.Sum256(data)
			sums[hex.EncodeToString(s[:])] = append(sums[hex.EncodeToString(s[:])], f)
		}
		if len(sums) != 1 {
			return false, fmt.Errorf("files differ: %v", sums)
		}
		return true, nil
	}
}
