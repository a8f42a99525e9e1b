package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/bitcoin/btcd"
	"github.com/crdipc/crdipc/internal/storage/blockdev"
	"github.com/crdipc/crdipc/internal/testenv/podmanifest"
	"github.com/crdipc/crdipc/internal/testenv/require"
)

// TestReplicatedVolume is the storage data path as a user meets it on `crdipc up --nodes 3`:
// a PVC of StorageClass crdipc and a busybox pod that writes a file to it; once the pod is
// gone the three replica files under the data dir are byte-identical and hold the data; a
// replica's Node is deleted and another added: the volume goes Degraded, then Healthy with a
// rebuilt replica, byte-identical again; a pod on another node reads the file back intact.
func TestReplicatedVolume(t *testing.T) {
	requireKubectl(t)
	require.Capable(t, "CRDIPC_REQUIRE_MOUNT", blockdev.Available())
	dataDir := t.TempDir()
	up := startUp(t, dataDir, "--nodes", "3")
	up.Kubectl(t, "apply", "-f", "../../config/samples/csi/storage_v1alpha1_storagepoolclaim.yaml")
	up.Kubectl(t, "apply", "-f", "../../config/samples/csi/pvc.yaml")
	up.Kubectl(t, "wait", "--for=jsonpath={.status.phase}=Bound", "pvc/data", "--timeout=60s")
	volume := up.Kubectl(t, "get", "pvc", "data", "-o", "jsonpath={.spec.volumeName}")

	// A random line, so the replica files can be searched for it.
	marker := fmt.Sprintf("crdipc-e2e-%d", time.Now().UnixNano())
	sum := sha256.Sum256([]byte(marker + "\n"))
	want := hex.EncodeToString(sum[:])
	up.Apply(t, busyboxPod("writer", "node-1", fmt.Sprintf(
		"echo %s > /data/hello && sync && sha256sum /data/hello | cut -d' ' -f1 > /data/hello.sha256 && sync", marker)))
	up.waitPodSucceeded(t, "writer")
	up.Kubectl(t, "delete", "pod", "writer", "--wait=true", "--timeout=60s")

	// Unstaged: the replicas were closed cleanly, identical, holding the line.
	up.Eventually(t, time.Minute, "three identical replica files holding the data", up.replicasIdentical(t, volume, 3, marker))

	// A replica's node goes; another joins.
	var gone string
	for _, n := range strings.Fields(up.Kubectl(t, "get", "cv", "-n", "crdipc-system", volume, "-o", "jsonpath={.status.replicas[*].node}")) {
		if n != "node-1" {
			gone = n
		}
	}
	if gone == "" {
		t.Fatalf("volume %s has no replica off node-1", volume)
	}
	up.Kubectl(t, "delete", "node", gone)
	up.Eventually(t, time.Minute, "the volume Degraded", func(context.Context) (bool, error) {
		if phase := up.Kubectl(t, "get", "cv", "-n", "crdipc-system", volume, "-o", "jsonpath={.status.phase}"); phase != "Degraded" {
			return false, fmt.Errorf("phase %q", phase)
		}
		return true, nil
	})
	up.Kubectl(t, "apply", "-f", "../../test/testdata/node-4.yaml") // as the README says
	up.Eventually(t, 2*time.Minute, "the volume Healthy with a replica on node-4", func(context.Context) (bool, error) {
		out := up.Kubectl(t, "get", "cv", "-n", "crdipc-system", volume, "-o", `jsonpath={.status.phase} {.status.replicas[*].node}`)
		if !strings.HasPrefix(out, "Healthy ") || !strings.Contains(out, "node-4") {
			return false, fmt.Errorf("phase and replica nodes: %s", out)
		}
		return true, nil
	})
	up.Eventually(t, time.Minute, "three identical replica files after the rebuild", up.replicasIdentical(t, volume, 3, marker))

	// Another node reads the file back.
	reader := "node-4"
	up.Apply(t, busyboxPod("reader", reader, fmt.Sprintf(
		"test \"$(cat /data/hello)\" = %s && test \"$(sha256sum /data/hello | cut -d' ' -f1)\" = \"$(cat /data/hello.sha256)\" && test \"$(cat /data/hello.sha256)\" = %s", marker, want)))
	up.waitPodSucceeded(t, "reader")

	// A BitcoinNetwork keeps its chain on a claim of the same class: btcd runs with its
	// datadir on the replicated volume.
	_, err := (btcd.Image{}).Find()
	require.Capable(t, "CRDIPC_REQUIRE_BTCD", err)
	up.Apply(t, "apiVersion: bitcoin.crdipc.io/v1alpha1\nkind: BitcoinNetwork\nmetadata:\n  name: kept\n  namespace: default\n"+
		"spec:\n  nodes: 1\n  storage:\n    storageClassName: crdipc\n    size: 64Mi\n")
	up.Kubectl(t, "wait", "--for=condition=Ready", "bitcoinnetwork/kept", "--timeout=120s")
	if phase := up.Kubectl(t, "get", "pvc", "data-kept-0", "-o", "jsonpath={.status.phase}"); phase != "Bound" {
		t.Fatalf("the network's claim data-kept-0 is %q, want Bound", phase)
	}
	mounts := up.Kubectl(t, "get", "pod", "kept-0", "-o", "jsonpath={.spec.volumes[?(@.name==\"data\")].persistentVolumeClaim.claimName}")
	if mounts != "data-kept-0" {
		t.Fatalf("pod kept-0 mounts %q at /data, want claim data-kept-0", mounts)
	}
}

// busyboxPod is a pod on node that runs script with the PVC data mounted at /data.
func busyboxPod(name, node, script string) string {
	p := podmanifest.Shell(name, "busybox:1.36", script)
	p.Hostname, p.Claim = node, "data"
	return p.Manifest()
}

// waitPodSucceeded waits for pod name to succeed, failing at once if it fails.
func (p *upProcess) waitPodSucceeded(t *testing.T, name string) {
	t.Helper()
	p.Eventually(t, 2*time.Minute, "pod "+name+" Succeeded", func(context.Context) (bool, error) {
		phase := p.Kubectl(t, "get", "pod", name, "-o", "jsonpath={.status.phase}")
		if phase == "Failed" {
			t.Fatalf("pod %s failed:\n%s", name, p.Kubectl(t, "get", "pod", name, "-o", "yaml"))
		}
		if phase != "Succeeded" {
			return false, fmt.Errorf("phase %q, container %s", phase, p.Kubectl(t, "get", "pod", name, "-o", "jsonpath={.status.containerStatuses[0].state}"))
		}
		return true, nil
	})
}

// replicasIdentical holds when volume reports n replica files (each replica's absolute
// path, from its status.replicas[*].location), all with the same bytes, holding marker.
func (p *upProcess) replicasIdentical(t *testing.T, volume string, n int, marker string) func(context.Context) (bool, error) {
	return func(context.Context) (bool, error) {
		out := p.Kubectl(t, "get", "cv", "-n", "crdipc-system", volume, "-o", `jsonpath={range .status.replicas[*]}{.location}{" "}{end}`)
		files := strings.Fields(out)
		if len(files) != n {
			replicas := p.Kubectl(t, "get", "cv", "-n", "crdipc-system", volume, "-o", "jsonpath={.status.replicas}")
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
