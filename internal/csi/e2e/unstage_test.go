package e2e_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/require"
)

// unstageBound is how long NodeUnstageVolume may take while another mount namespace holds a
// copy of the volume's mounts: the export's close timeout (10 s) for the loop device that the
// copy's file system keeps open, and as much again for the rest.
const unstageBound = 20 * time.Second

// testUnstageWithAMountCopy: while a volume is staged and published on node-1, a process
// makes a private copy of the mount table (a container runtime, a tool, a unit with private
// mounts) and keeps it. The pod goes: NodeUnpublishVolume and NodeUnstageVolume on node-1
// must complete within unstageBound all the same, and node-2 then stages the volume (its
// target takes the replicas' writer sessions) and reads back every file node-1 wrote, also
// the one written without fsync.
func (w *world) testUnstageWithAMountCopy(t *testing.T) {
	testenv.RequireMounts(t)
	require.Tools(t, "CRDIPC_REQUIRE_MOUNT", "unshare", "sleep")
	ctx := context.Background()
	conn := w.dial(t)
	created, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               "unstage-copy",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 64 * mib},
		Parameters:         map[string]string{driver.ParamReplicaCount: strconv.Itoa(2)},
		VolumeCapabilities: []*csi.VolumeCapability{mountRWO()},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := created.Volume.VolumeId
	node1 := &nodePlugin{node: "node-1", nc: csi.NewNodeClient(conn), dir: t.TempDir()}
	dir, _ := node1.mount(t, id)
	files := map[string]string{}
	for i, sync := range []bool{true, false} {
		data := make([]byte, 256<<10)
		_, _ = rand.Read(data)
		name := fmt.Sprintf("f%d", i)
		write := os.WriteFile
		if sync {
			write = func(p string, b []byte, _ os.FileMode) error { return writeFileSync(p, b) }
		}
		if err := write(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		files[name] = hex.EncodeToString(sum[:])
	}
	staging, target := filepath.Join(node1.dir, id, "staging"), filepath.Join(node1.dir, id, "target")
	holdMountCopy(t, staging, target)

	start := time.Now()
	uctx, cancel := context.WithTimeout(ctx, unstageBound)
	defer cancel()
	if _, err := node1.nc.NodeUnpublishVolume(uctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublishVolume with a copy of the mounts elsewhere: %v", err)
	}
	if _, err := node1.nc.NodeUnstageVolume(uctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatalf("NodeUnstageVolume with a copy of the mounts elsewhere, after %s: %v", time.Since(start).Round(time.Millisecond), err)
	}
	t.Logf("unpublished and unstaged in %s with a copy of the mounts in another namespace", time.Since(start).Round(time.Millisecond))

	node2 := w.startNodePlugin(t, "node-2")
	dir2, unmount2 := node2.mount(t, id)
	w.checkFiles(t, dir2, files)
	unmount2()
	if _, err := csi.NewControllerClient(conn).DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("DeleteVolume: %v", err)
	}
}

// holdMountCopy starts a process that holds a private copy of this mount namespace's mount
// table, and returns once the copy has every one of paths mounted; the process is killed
// when the test ends.
func holdMountCopy(t *testing.T, paths ...string) {
	t.Helper()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "600")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	pid := cmd.Process.Pid
	testenv.Eventually(t, 30*time.Second, "the copy of the mount table", func(context.Context) (bool, error) {
		// unshare execs sleep once the namespace is made: until then the table is ours.
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || filepath.Base(exe) != "sleep" {
			return false, fmt.Errorf("unshare has not started sleep yet (%s, %v)", exe, err)
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		if err != nil {
			return false, err
		}
		for _, p := range paths {
			if !strings.Contains(string(b), " "+p+" ") {
				return false, fmt.Errorf("%s is not in the copy", p)
			}
		}
		return true, nil
	})
}
