package operator_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/storage/agent"
	"github.com/crdipc/crdipc/internal/storage/dataca"
	"github.com/crdipc/crdipc/internal/storage/target"
	"github.com/crdipc/crdipc/internal/testenv"
)

// smallDisk puts a 16 MiB ext4 file system, on a loopback image, at dir: a node disk that
// fills. Mount privilege and mkfs.ext4 are needed: skipped without them, failed when
// CRDIPC_REQUIRE_MOUNT=1 (CI).
func smallDisk(t *testing.T, dir string) {
	t.Helper()
	testenv.RequireMounts(t)
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"truncate", "-s", "16M", img},
		{"mkfs.ext4", "-q", "-F", "-m", "0", img},
		{"mount", "-o", "loop,nodev,nosuid", img, dir},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() {
		// Lazily: the agents, stopped by a cleanup that runs after this one, may still use it;
		// the loop device is freed once the mount is gone (mount -o loop sets autoclear).
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
}

// fill takes all but about 512 KiB of the file system at dir, as another writer on a shared
// disk would, and returns the file to remove to give the space back.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 256<<10)
	for {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		avail := int64(st.Bavail) * st.Bsize
		if avail <= 512<<10 {
			return path
		}
		if _, err := f.Write(chunk[:min(int64(len(chunk)), avail-512<<10)]); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
}

// A node's disk fills under a volume's writes: the replica there fails with a condition
// naming ENOSPC and leaves the write set, the volume goes on with the other two, its pool
// says it is full, other pools and volumes are unaffected, and nothing written is lost or
// corrupted. Once space is freed the replica is rebuilt and holds the same bytes.
func TestDiskFull(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	full := c.nodeName(1)
	smallDisk(t, c.agentRoot(full))
	withData := func(o *agent.Options) { o.DataAddr = "127.0.0.1:0" }
	for i := 1; i <= 3; i++ {
		c.addNode(c.nodeName(i))
		c.startAgent(c.nodeName(i), withData)
	}
	c.startOperator()
	claim := c.createClaim("full", nil)
	c.waitPools(claim.Name, 3)

	const size = 8 * mib
	c.createVolume("vol", 3, size)
	vol := c.waitVolume("vol", 30*time.Second, "Healthy with endpoints", func(v *storagev1alpha1.CStorVolume, ready *metav1.Condition) bool {
		if !volumeReady(v, ready) {
			return false
		}
		for _, r := range v.Status.Replicas {
			if r.Endpoint == "" {
				return false
			}
		}
		return true
	})
	filler := fill(t, c.agentRoot(full))

	// The pool on the full disk says so, and is no longer offered to new volumes.
	poolOn := func(node string) string { return storagev1alpha1.PoolName(claim.Name, node) }
	testenv.Eventually(t, 20*time.Second, "the full pool reports NoSpace", func(ctx context.Context) (bool, error) {
		var p storagev1alpha1.CStorPool
		if err := c.c.Get(ctx, client.ObjectKey{Name: poolOn(full)}, &p); err != nil {
			return false, err
		}
		ready := meta.FindStatusCondition(p.Status.Conditions, conditions.TypeReady)
		if p.Status.Phase != storagev1alpha1.PoolPhaseDegraded || ready == nil || ready.Reason != agent.ReasonNoSpace || !strings.Contains(ready.Message, "ENOSPC") {
			return false, fmt.Errorf("pool %s: %s %+v", p.Name, p.Status.Phase, ready)
		}
		return true, nil
	})

	// The volume's target, as a node's CSI plugin runs it, writes the whole volume.
	ca, err := dataca.Load(ctx, c.c, install.SystemNamespace)
	if err != nil {
		t.Fatal(err)
	}
	_, tlsConf, err := dataca.Issue(ca, dataca.CommonName(dataca.RoleCSINode, "test-node"))
	if err != nil {
		t.Fatal(err)
	}
	var members []target.Member
	for _, r := range vol.Status.Replicas {
		members = append(members, target.RemoteMember(storagev1alpha1.ReplicaDataID(vol.Namespace, r.Name), r.Endpoint, tlsConf, false))
	}
	ectx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	e, err := target.New(ectx, target.Options{Members: members, ConsistencyFactor: 2, Size: size, RejoinInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			e.Close()
		}
	}()
	if err := e.WaitQuorum(ectx); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	for off := 0; off < size; off += mib {
		if _, err := e.WriteAt(data[off:off+mib], int64(off)); err != nil {
			t.Fatalf("write at %d: %v (the volume has two replicas with space)", off, err)
		}
	}
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}

	// The replica on the full disk: Error, NoSpace, ENOSPC named; the others Healthy.
	onFull := storagev1alpha1.ReplicaName("vol", poolOn(full))
	testenv.Eventually(t, 20*time.Second, "the replica on the full disk reports ENOSPC", func(ctx context.Context) (bool, error) {
		rs, err := c.replicas(ctx, "vol")
		if err != nil {
			return false, err
		}
		var state []string
		ok := len(rs) == 3
		for _, r := range rs {
			ready := meta.FindStatusCondition(r.Status.Conditions, conditions.TypeReady)
			if ready == nil {
				return false, fmt.Errorf("%s has no Ready condition", r.Name)
			}
			state = append(state, fmt.Sprintf("%s=%s/%s %q", r.Name, r.Status.Phase, ready.Reason, ready.Message))
			if r.Name == onFull {
				ok = ok && r.Status.Phase == storagev1alpha1.ReplicaPhaseError && ready.Reason == agent.ReasonNoSpace && strings.Contains(ready.Message, "ENOSPC")
			} else {
				ok = ok && r.Status.Phase == storagev1alpha1.ReplicaPhaseHealthy
			}
		}
		if !ok {
			return false, errors.New(strings.Join(state, "; "))
		}
		return true, nil
	})
	if st := e.States()[storagev1alpha1.ReplicaDataID(vol.Namespace, onFull)]; st.State != target.Faulted {
		t.Errorf("the target has the full replica %s, want Faulted", st.State)
	}

	// Other pools stay Healthy and take a new volume, which avoids the full pool.
	for i := 2; i <= 3; i++ {
		var p storagev1alpha1.CStorPool
		if err := c.c.Get(ctx, client.ObjectKey{Name: poolOn(c.nodeName(i))}, &p); err != nil || p.Status.Phase != storagev1alpha1.PoolPhaseHealthy {
			t.Errorf("pool on %s: %s, %v; want Healthy", c.nodeName(i), p.Status.Phase, err)
		}
	}
	c.createVolume("other", 2, 4*mib)
	other := c.waitVolume("other", 30*time.Second, "Healthy", volumeReady)
	for _, r := range other.Status.Replicas {
		if r.Node == full {
			t.Errorf("volume other has a replica on the full node %s", full)
		}
	}

	// What was acknowledged reads back.
	got := make([]byte, size)
	if _, err := e.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("the volume's data differs from what was written")
	}

	// Space comes back: the target takes the replica in again and rebuilds it.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "the replica rebuilt after space was freed", func(ctx context.Context) (bool, error) {
		var r storagev1alpha1.CStorVolumeReplica
		if err := c.c.Get(ctx, client.ObjectKey{Namespace: c.ns, Name: onFull}, &r); err != nil {
			return false, err
		}
		if st := e.States()[storagev1alpha1.ReplicaDataID(vol.Namespace, onFull)]; st.State != target.Healthy {
			return false, fmt.Errorf("target: %s (%v); replica %s", st.State, st.Err, r.Status.Phase)
		}
		if r.Status.Phase != storagev1alpha1.ReplicaPhaseHealthy {
			return false, fmt.Errorf("replica %s", r.Status.Phase)
		}
		return true, nil
	})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	want := sha256.Sum256(data)
	rs, err := c.replicas(ctx, "vol")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		b, err := os.ReadFile(r.Status.Location)
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(b) != want {
			t.Errorf("replica %s on %s does not hold the volume's data", r.Name, r.Spec.NodeName)
		}
	}
}
