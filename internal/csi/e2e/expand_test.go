package e2e_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/nodeservice"
	"github.com/crdipc/crdipc/internal/csi/sidecar"
	"github.com/crdipc/crdipc/internal/podsim"
	"github.com/crdipc/crdipc/internal/podsim/busybox"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/require"
)

// ext4Online says why this process cannot grow a mounted ext4 file system (no
// CAP_SYS_RESOURCE, as on the CI machine, whose container lacks it even in its bounding
// set), or nil when it can. Under CRDIPC_REQUIRE_ONLINE_RESIZE=1, a host that must, it
// fails the test instead.
func ext4Online(t *testing.T) error {
	t.Helper()
	return require.Strict(t, "CRDIPC_REQUIRE_ONLINE_RESIZE", driver.OnlineResizeAvailable("ext4"))
}

// growable is a file system the node plugin can grow while mounted here, with a claim size
// it can be made at and one it grows to: ext4 where the process may (CAP_SYS_RESOURCE),
// else xfs (xfs_growfs needs only what mounting needs; mkfs.xfs makes nothing below 300 MB).
type growable struct {
	fsType      string
	small, big  string // claim sizes
	smallBytes  int64
	growthBytes int64
}

func growableFS(t *testing.T) growable {
	t.Helper()
	err := ext4Online(t)
	if err == nil {
		return growable{fsType: "ext4", small: "64Mi", big: "128Mi", smallBytes: 64 * mib, growthBytes: 64 * mib}
	}
	t.Logf("ext4 cannot grow online here (%v): growing xfs instead", err)
	if err := require.Missing("mkfs.xfs"); err != nil {
		require.Capable(t, "CRDIPC_REQUIRE_MOUNT", fmt.Errorf("neither ext4 (no CAP_SYS_RESOURCE) nor xfs (install xfsprogs) can grow online here: %w", err))
	}
	return growable{fsType: "xfs", small: "320Mi", big: "384Mi", smallBytes: 320 * mib, growthBytes: 64 * mib}
}

// replicaEverywhere is the replica count that puts a replica on every node with a pool, so
// that node-1, which the world's driver serves, has one.
func (w *world) replicaEverywhere(t *testing.T) string {
	t.Helper()
	var pools storagev1alpha1.CStorPoolList
	if err := w.c.List(context.Background(), &pools); err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(len(pools.Items))
}

func (w *world) dial(t *testing.T) *grpc.ClientConn {
	t.Helper()
	conn, err := sidecar.Dial(w.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// testControllerExpand: ControllerExpandVolume grows the CStorVolume and every replica and
// asks for the node step; a repeated call, or one asking for no more than the volume has,
// is OK with its size; a limit below it is OutOfRange naming both sizes; a size larger than
// the replicas' pools is OutOfRange before the volume changes; an unknown volume NotFound.
// ControllerGetVolume and ControllerGetVolumeHealth report the grown, healthy volume.
func (w *world) testControllerExpand(t *testing.T) {
	ctx := context.Background()
	cc := csi.NewControllerClient(w.dial(t))
	created, err := cc.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               "expand-me",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 8 * mib},
		Parameters:         map[string]string{driver.ParamReplicaCount: "3"},
		VolumeCapabilities: []*csi.VolumeCapability{mountRWO()},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := created.Volume.VolumeId
	t.Cleanup(func() {
		if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("DeleteVolume: %v", err)
		}
	})
	expand := func(required, limit int64) (*csi.ControllerExpandVolumeResponse, error) {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		return cc.ControllerExpandVolume(cctx, &csi.ControllerExpandVolumeRequest{
			VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit}, VolumeCapability: mountRWO(),
		})
	}
	for i := range 2 { // the second call finds the volume grown: the same answer
		resp, err := expand(16*mib, 0)
		if err != nil {
			t.Fatalf("ControllerExpandVolume to 16Mi (call %d): %v", i+1, err)
		}
		if resp.CapacityBytes != 16*mib || !resp.NodeExpansionRequired {
			t.Fatalf("ControllerExpandVolume to 16Mi (call %d): %+v, want 16Mi and node expansion required", i+1, resp)
		}
	}
	vol := w.volume(t, id)
	if vol.Spec.Capacity.Value() != 16*mib || vol.Status.Capacity == nil || vol.Status.Capacity.Value() != 16*mib {
		t.Fatalf("CStorVolume capacity %s, status.capacity %v: want 16Mi, grown", vol.Spec.Capacity.String(), vol.Status.Capacity)
	}
	// Every replica's data is the new size on disk.
	for _, r := range vol.Status.Replicas {
		fi, err := os.Stat(r.Location)
		if err != nil || fi.Size() < 16*mib {
			t.Errorf("replica %s at %s: %v, size %d; want at least 16Mi", r.Name, r.Location, err, fi.Size())
		}
	}
	if resp, err := expand(8*mib, 0); err != nil || resp.CapacityBytes != 16*mib {
		t.Errorf("ControllerExpandVolume asking for 8Mi of a 16Mi volume: %+v, %v; want OK with 16Mi", resp, err)
	}
	if _, err := expand(4*mib, 8*mib); status.Code(err) != codes.OutOfRange || !strings.Contains(err.Error(), "is 16Mi; shrinking to 8Mi is not supported") {
		t.Errorf("ControllerExpandVolume with a limit of 8Mi on a 16Mi volume: %v, want OutOfRange saying it does not shrink", err)
	}
	if _, err := expand(20<<30, 0); status.Code(err) != codes.OutOfRange || !strings.Contains(err.Error(), "which holds 10Gi in all") {
		t.Errorf("ControllerExpandVolume to 20Gi on 10Gi pools: %v, want OutOfRange naming the pool", err)
	}
	if c := w.volume(t, id).Spec.Capacity; c.Value() != 16*mib {
		t.Errorf("CStorVolume capacity %s after a refused growth, want 16Mi", c.String())
	}
	if _, err := cc.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: "no-such-volume", CapacityRange: &csi.CapacityRange{RequiredBytes: mib}}); status.Code(err) != codes.NotFound {
		t.Errorf("ControllerExpandVolume of an unknown volume: %v, want NotFound", err)
	}
	got, err := cc.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id})
	if err != nil || got.GetVolume().GetCapacityBytes() != 16*mib {
		t.Errorf("ControllerGetVolume: %+v, %v; want 16Mi", got, err)
	}
	h, err := cc.ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
	if err != nil || h.GetVolumeHealth().GetVolumeId() != id || len(h.GetVolumeHealth().GetHealthStatuses()) != 0 {
		t.Errorf("ControllerGetVolumeHealth of a healthy volume: %+v, %v; want no adverse entry", h, err)
	}
}

// testNodeExpandAndStats: a mount volume (ext4) staged and published on node-1: its
// NodeGetVolumeStats, at the target and at the staging path, are the file system's statfs
// (bytes and inodes); another path is NotFound. NodeExpandVolume before the controller grew
// the volume is OutOfRange; after ControllerExpandVolume it grows the target, the loop
// device and the file system online: statfs of the published path shows the larger file
// system, the data written before is intact, and a repeated call is OK.
func (w *world) testNodeExpandAndStats(t *testing.T) {
	ctx := context.Background()
	conn := w.dial(t)
	cc, nc := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	created, err := cc.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               "node-expand",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 32 * mib},
		Parameters:         map[string]string{driver.ParamReplicaCount: w.replicaEverywhere(t)},
		VolumeCapabilities: []*csi.VolumeCapability{mountRWO()},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := created.Volume.VolumeId
	t.Cleanup(func() {
		if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("DeleteVolume: %v", err)
		}
	})
	testenv.RequireMounts(t)
	node1 := &nodePlugin{node: "node-1", nc: nc, dir: t.TempDir()}
	target, unmount := node1.mount(t, id)
	staging := filepath.Join(filepath.Dir(target), "staging")
	data := make([]byte, 4*mib)
	_, _ = rand.Read(data)
	if err := writeFileSync(filepath.Join(target, "before"), data); err != nil {
		t.Fatal(err)
	}

	stats := func(path string) (bytesU, inodes *csi.VolumeUsage) {
		t.Helper()
		resp, err := nc.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: path, StagingTargetPath: staging})
		if err != nil {
			t.Fatalf("NodeGetVolumeStats at %s: %v", path, err)
		}
		for _, u := range resp.Usage {
			switch u.Unit {
			case csi.VolumeUsage_BYTES:
				bytesU = u
			case csi.VolumeUsage_INODES:
				inodes = u
			}
		}
		if bytesU == nil || inodes == nil {
			t.Fatalf("NodeGetVolumeStats at %s: %+v, want bytes and inodes", path, resp.Usage)
		}
		return bytesU, inodes
	}
	statfs := func(path string) unix.Statfs_t {
		t.Helper()
		var st unix.Statfs_t
		if err := unix.Statfs(path, &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	for _, p := range []string{target, staging} {
		b, in := stats(p)
		st := statfs(p)
		bs := int64(st.Bsize)
		if b.Total != int64(st.Blocks)*bs || b.Available != int64(st.Bavail)*bs || b.Used != int64(st.Blocks-st.Bfree)*bs {
			t.Errorf("bytes at %s: %+v; statfs says total %d, available %d, used %d", p, b, int64(st.Blocks)*bs, int64(st.Bavail)*bs, int64(st.Blocks-st.Bfree)*bs)
		}
		if in.Total != int64(st.Files) || in.Available != int64(st.Ffree) || in.Used != int64(st.Files-st.Ffree) {
			t.Errorf("inodes at %s: %+v; statfs says total %d, free %d", p, in, st.Files, st.Ffree)
		}
		if b.Used < int64(len(data)) {
			t.Errorf("bytes used at %s: %d, less than the %d bytes written", p, b.Used, len(data))
		}
	}
	if _, err := nc.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: node1.dir}); status.Code(err) != codes.NotFound {
		t.Errorf("NodeGetVolumeStats at a path that is not the volume: %v, want NotFound", err)
	}
	if h, err := nc.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: id, VolumePublishPath: target, StagingTargetPath: staging}); err != nil || len(h.GetVolumeHealth().GetHealthStatuses()) != 0 {
		t.Errorf("NodeGetVolumeHealth of a healthy staged volume: %+v, %v; want no adverse entry", h, err)
	}

	t.Run("Grow", func(t *testing.T) { w.testNodeGrow(t, node1, id, target, staging, data, unmount) })
	unmount()
	w.sameReplicas(t, id)
}

// testNodeGrow is the growth part of testNodeExpandAndStats, on volume id (32Mi) published
// at target by node1, which holds the file "before" with data; unmount unpublishes and
// unstages it.
func (w *world) testNodeGrow(t *testing.T, node1 *nodePlugin, id, target, staging string, data []byte, unmount func()) {
	ctx := context.Background()
	conn := w.dial(t)
	cc, nc := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	stats := func(path string) *csi.VolumeUsage {
		t.Helper()
		resp, err := nc.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: path, StagingTargetPath: staging})
		if err != nil || len(resp.Usage) == 0 {
			t.Fatalf("NodeGetVolumeStats at %s: %+v, %v", path, resp, err)
		}
		return resp.Usage[0]
	}
	statfs := func(path string) unix.Statfs_t {
		t.Helper()
		var st unix.Statfs_t
		if err := unix.Statfs(path, &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	nodeExpand := func(size int64) (*csi.NodeExpandVolumeResponse, error) {
		return nc.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{
			VolumeId: id, VolumePath: target, StagingTargetPath: staging,
			CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: mountRWO(),
		})
	}
	if _, err := nodeExpand(64 * mib); status.Code(err) != codes.OutOfRange {
		t.Errorf("NodeExpandVolume before ControllerExpandVolume: %v, want OutOfRange", err)
	}
	if cannot := ext4Online(t); cannot != nil {
		// What a node without CAP_SYS_RESOURCE answers: refused before anything changes,
		// saying why; the file system and its data stay as they were.
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if _, err := cc.ControllerExpandVolume(cctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mib}}); err != nil {
			t.Fatalf("ControllerExpandVolume to 64Mi: %v", err)
		}
		before := statfs(target)
		if _, err := nodeExpand(64 * mib); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "CAP_SYS_RESOURCE") {
			t.Errorf("NodeExpandVolume of a mounted ext4 without CAP_SYS_RESOURCE: %v, want FailedPrecondition naming it", err)
		}
		if after := statfs(target); after.Blocks != before.Blocks {
			t.Errorf("a refused NodeExpandVolume changed the file system: %d blocks, was %d", after.Blocks, before.Blocks)
		}
		if got, err := os.ReadFile(filepath.Join(target, "before")); err != nil || !bytes.Equal(got, data) {
			t.Errorf("the file written before: %v (equal: %v)", err, bytes.Equal(got, data))
		}
		// As the CSI spec has it for FAILED_PRECONDITION, and a kubelet does: staged again,
		// the file system is grown while unmounted, and NodeExpandVolume then finds it done.
		unmount()
		target, _ = node1.mount(t, id)
		if grown := statfs(target); int64(grown.Blocks)*int64(grown.Bsize) < int64(before.Blocks)*int64(before.Bsize)+24*mib {
			t.Errorf("staged again after growing from 32Mi to 64Mi: %d bytes, was %d", int64(grown.Blocks)*int64(grown.Bsize), int64(before.Blocks)*int64(before.Bsize))
		}
		if resp, err := nodeExpand(64 * mib); err != nil || resp.CapacityBytes != 64*mib {
			t.Errorf("NodeExpandVolume to 64Mi once staged again: %+v, %v; want 64Mi", resp, err)
		}
		if got, err := os.ReadFile(filepath.Join(target, "before")); err != nil || !bytes.Equal(got, data) {
			t.Errorf("the file written before, staged again: %v (equal: %v)", err, bytes.Equal(got, data))
		}
		if err := writeFileSync(filepath.Join(target, "after"), make([]byte, 40*mib)); err != nil {
			t.Errorf("writing 40Mi into the grown file system: %v", err)
		}
		return
	}
	before := statfs(target)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := cc.ControllerExpandVolume(cctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mib}}); err != nil {
		t.Fatalf("ControllerExpandVolume to 64Mi: %v", err)
	}
	for i := range 2 {
		resp, err := nodeExpand(64 * mib)
		if err != nil || resp.CapacityBytes != 64*mib {
			t.Fatalf("NodeExpandVolume to 64Mi (call %d): %+v, %v", i+1, resp, err)
		}
	}
	after := statfs(target)
	beforeBytes, afterBytes := int64(before.Blocks)*int64(before.Bsize), int64(after.Blocks)*int64(after.Bsize)
	if afterBytes < beforeBytes+30*mib {
		t.Errorf("file system at %s: %d bytes after growing the volume from 32Mi to 64Mi, was %d", target, afterBytes, beforeBytes)
	}
	if b := stats(target); b.Total != afterBytes {
		t.Errorf("NodeGetVolumeStats after the growth: total %d, statfs %d", b.Total, afterBytes)
	}
	if got, err := os.ReadFile(filepath.Join(target, "before")); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the file written before the growth: %v (equal: %v)", err, bytes.Equal(got, data))
	}
	// The grown end is usable: a file larger than the old free space fits.
	big := make([]byte, 40*mib)
	if err := writeFileSync(filepath.Join(target, "after"), big); err != nil {
		t.Errorf("writing 40Mi into the grown file system: %v", err)
	}
}

// testPodExpansion is issue 12's acceptance on the simulated kubelet of up: a busybox pod
// writes to a 64Mi claim and keeps printing its df; the claim is patched to 128Mi (on xfs,
// where ext4 cannot grow online here: 320Mi to 384Mi); the
// sidecar expands the volume, the kubelet grows it on the pod's node, and the same pod,
// never restarted, sees the larger file system with its data intact. The claim then shows
// 128Mi, no resize condition left. Shrinking the claim is refused by the API server.
func (w *world) testPodExpansion(t *testing.T) {
	testenv.RequireMounts(t)
	fs := growableFS(t)
	ctx := context.Background()
	sc := w.growableClass(t, fs.fsType)
	podRoot := t.TempDir()                      // inside the drivers' kubelet root, os.TempDir()
	csiDir, err := os.MkdirTemp("", "csi-pods") // socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(csiDir) })
	csiNode := w.env.AsServiceAccount(t, "csi-node")
	nodes, err := nodeservice.New(nodeservice.Options{Config: csiNode, NodeConfig: func(node string) (*rest.Config, error) { return testenv.BoundTo(csiNode, node), nil }, Dir: csiDir, KubeletRoot: podRoot})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nodes.Stop) // after the kubelet, which unmounts through them
	mgr := testenv.NewManager(t, w.env.Config)
	if err := podsim.Add(mgr, podsim.Options{
		Root: podRoot, Images: map[string]podsim.Image{busybox.Name: busybox.Image{}},
		RestartBackoff: time.Second, StopTimeout: 5 * time.Second, CSI: nodes.Client, CSIDriver: driver.Name,
	}); err != nil {
		t.Fatal(err)
	}
	testenv.Start(t, "kubelet", mgr.Start)
	testenv.Eventually(t, 30*time.Second, "the default ServiceAccount", func(ctx context.Context) (bool, error) {
		err := w.c.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: "default"}, &corev1.ServiceAccount{})
		return err == nil, err
	})

	k := &dfKubelet{w: w, root: podRoot}
	pvc := k.claim(t, "grows", sc.Name, fs.small)
	pod := k.pod(t, "df", pvc.Name)
	logFile := k.logFile(t, pod)
	lastSize := func() (int64, string, error) { return k.lastSize(ctx, pod) }
	var small int64
	testenv.Eventually(t, 90*time.Second, "the pod printing its df", func(context.Context) (bool, error) {
		n, state, err := lastSize()
		if err != nil {
			return false, err
		}
		small = n
		if state != "intact" || n <= fs.smallBytes*3/4 || n > fs.smallBytes {
			return false, fmt.Errorf("size %d, %s", n, state)
		}
		return true, nil
	})

	if err := w.c.Patch(ctx, pvc, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"resources":{"requests":{"storage":"`+fs.big+`"}}}}`))); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, "the pod's df showing the larger file system", func(context.Context) (bool, error) {
		n, state, err := lastSize()
		if err != nil {
			return false, err
		}
		if state != "intact" || n <= small+fs.growthBytes*7/8 {
			return false, fmt.Errorf("size %d (was %d), %s", n, small, state)
		}
		return true, nil
	})
	var p corev1.Pod
	if err := w.c.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil {
		t.Fatal(err)
	}
	out, _ := os.ReadFile(logFile)
	if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].RestartCount != 0 ||
		strings.Count(string(out), "started\n") != 1 || strings.Contains(string(out), "BROKEN") {
		t.Errorf("pod %s, containers %+v, log:\n%s\nwant the same process running throughout, the data intact", p.Status.Phase, p.Status.ContainerStatuses, out)
	}
	w.waitResized(t, pvc, fs.big)
	testenv.Eventually(t, 10*time.Second, "the Event FileSystemResizeSuccessful on the pod", func(ctx context.Context) (bool, error) {
		evs, err := w.events(ctx, &p)
		if err != nil {
			return false, err
		}
		for _, e := range evs {
			if e.Reason == "FileSystemResizeSuccessful" {
				return true, nil
			}
		}
		return false, fmt.Errorf("%d events, none FileSystemResizeSuccessful", len(evs))
	})

	err = w.c.Patch(ctx, pvc, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"resources":{"requests":{"storage":"`+fs.small+`"}}}}`)))
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "can not be less than status.capacity") {
		t.Errorf("shrinking the claim to %s: %v, want it refused: can not be less than status.capacity", fs.small, err)
	}

	if ext4Online(t) == nil {
		return // the claim above was ext4, grown online
	}
	t.Run("Ext4AtNextStage", func(t *testing.T) { w.testExt4AtNextStage(t, k) })
}

// testExt4AtNextStage is issue 12's acceptance where ext4 cannot grow online (no
// CAP_SYS_RESOURCE): a busybox pod on a 64Mi ext4 claim; the claim is patched to 128Mi;
// NodeExpandVolume answers FailedPrecondition, "not while in use", and the claim says so and
// stays pending, the pod's file system as it was; the pod is replaced, the volume staged
// again grows unmounted, and the new pod sees 128Mi with the data intact; the claim's
// resize is done.
func (w *world) testExt4AtNextStage(t *testing.T, k *dfKubelet) {
	ctx := context.Background()
	sc := w.growableClass(t, "ext4")
	pvc := k.claim(t, "grows-ext4", sc.Name, "64Mi")
	first := k.pod(t, "df-ext4", pvc.Name)
	waitSize := func(pod *corev1.Pod, what string, ok func(int64) bool) {
		t.Helper()
		testenv.Eventually(t, 90*time.Second, what, func(ctx context.Context) (bool, error) {
			n, state, err := k.lastSize(ctx, pod)
			if err != nil {
				return false, err
			}
			if state != "intact" || !ok(n) {
				return false, fmt.Errorf("size %d, %s", n, state)
			}
			return true, nil
		})
	}
	small := func(n int64) bool { return n > 48*mib && n <= 64*mib }
	waitSize(first, "the pod printing its df", small)
	if err := w.c.Patch(ctx, pvc, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}`))); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, "the claim pending, saying it grows at the next stage", func(ctx context.Context) (bool, error) {
		if err := w.c.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
			return false, err
		}
		for _, c := range pvc.Status.Conditions {
			if c.Type == corev1.PersistentVolumeClaimNodeResizeError && strings.Contains(c.Message, "CAP_SYS_RESOURCE") && strings.Contains(c.Message, "next staged") &&
				pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] == corev1.PersistentVolumeClaimNodeResizePending {
				return true, nil
			}
		}
		return false, fmt.Errorf("conditions %+v, allocatedResourceStatuses %v", pvc.Status.Conditions, pvc.Status.AllocatedResourceStatuses)
	})
	waitSize(first, "the pod's file system as it was", small)
	k.deletePod(t, first)
	second := k.pod(t, "df-ext4-again", pvc.Name)
	waitSize(second, "the new pod's df showing the larger file system", func(n int64) bool { return n > 112*mib && n <= 128*mib })
	w.waitResized(t, pvc, "128Mi")
}

// waitResized waits until claim's capacity is size and no resize condition or status is
// left.
func (w *world) waitResized(t *testing.T, pvc *corev1.PersistentVolumeClaim, size string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "the claim at "+size+", its resize done", func(ctx context.Context) (bool, error) {
		if err := w.c.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
			return false, err
		}
		c := pvc.Status.Capacity[corev1.ResourceStorage]
		var resizing []corev1.PersistentVolumeClaimCondition
		for _, cond := range pvc.Status.Conditions {
			switch cond.Type {
			case corev1.PersistentVolumeClaimResizing, corev1.PersistentVolumeClaimFileSystemResizePending,
				corev1.PersistentVolumeClaimControllerResizeError, corev1.PersistentVolumeClaimNodeResizeError:
				resizing = append(resizing, cond)
			}
		}
		if c.Cmp(resource.MustParse(size)) != 0 || len(resizing) != 0 || len(pvc.Status.AllocatedResourceStatuses) != 0 {
			return false, fmt.Errorf("capacity %s, conditions %+v, allocatedResourceStatuses %v", c.String(), pvc.Status.Conditions, pvc.Status.AllocatedResourceStatuses)
		}
		return true, nil
	})
}

// growableClass creates a StorageClass of the driver whose claims grow, with file system
// fsType, deleted with the test.
func (w *world) growableClass(t *testing.T, fsType string) *storagev1.StorageClass {
	t.Helper()
	sc := &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: class + "-" + fsType},
		Provisioner:          driver.Name,
		Parameters:           map[string]string{driver.ParamReplicaCount: "3", "csi.storage.k8s.io/fstype": fsType},
		ReclaimPolicy:        ptr.To(corev1.PersistentVolumeReclaimDelete),
		AllowVolumeExpansion: ptr.To(true),
	}
	if err := w.c.Create(context.Background(), sc); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.c.Delete(context.Background(), sc) })
	return sc
}

// dfKubelet makes the claims and busybox pods of the expansion tests on a simulated
// kubelet whose pods live under root.
type dfKubelet struct {
	w    *world
	root string
}

// claim creates a claim of class and size, deleted with the test, and waits until it is Bound.
func (k *dfKubelet) claim(t *testing.T, name, class, size string) *corev1.PersistentVolumeClaim {
	t.Helper()
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: k.w.ns, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To(class),
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
	if err := k.w.c.Create(context.Background(), pvc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.w.c.Delete(context.Background(), pvc) })
	k.w.waitBound(t, pvc, 60*time.Second)
	return pvc
}

// dfScript writes 8Mi to /data/before once (a pod that finds it there checks it instead),
// then prints the file system's size and whether the file is intact, twice a second.
const dfScript = `set -e
if [ ! -f /data/before ]; then
  head -c 8388608 /dev/urandom > /data/before
  sha256sum /data/before > /data/before.sha256
  sync
fi
echo started
while :; do
  echo "size $(df -kP /data | awk 'NR==2 {print $2}') $(sha256sum -c /data/before.sha256 >/dev/null 2>&1 && echo intact || echo BROKEN)"
  sleep 0.5
done`

// pod starts a busybox pod on node-2 running dfScript on claim; it is deleted with the test
// (its volume unstaged before the kubelet stops) or by deletePod.
func (k *dfKubelet) pod(t *testing.T, name, claim string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: k.w.ns, Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			NodeSelector:                  map[string]string{corev1.LabelHostname: "node-2"},
			Containers: []corev1.Container{{
				Name: "main", Image: "busybox:1.36", Command: []string{"sh", "-c", dfScript},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
			}}},
		},
	}
	if err := k.w.c.Create(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.deletePod(t, pod) })
	return pod
}

// deletePod deletes pod and waits until it is gone, its volumes unmounted.
func (k *dfKubelet) deletePod(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	_ = k.w.c.Delete(context.Background(), pod)
	testenv.Eventually(t, 60*time.Second, "the pod "+pod.Name+" gone", func(ctx context.Context) (bool, error) {
		if err := k.w.c.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{}); !apierrors.IsNotFound(err) {
			return false, fmt.Errorf("get: %v", err)
		}
		return true, nil
	})
}

// logFile is where the kubelet keeps pod's output, once the pod has its UID.
func (k *dfKubelet) logFile(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	var p corev1.Pod
	if err := k.w.c.Get(context.Background(), client.ObjectKeyFromObject(pod), &p); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(k.root, string(p.UID), "main.log")
}

var sizeLine = regexp.MustCompile(`size (\d+) (intact|BROKEN)\n`)

// lastSize is the file system size in bytes and the file's state that pod printed last.
func (k *dfKubelet) lastSize(ctx context.Context, pod *corev1.Pod) (int64, string, error) {
	var p corev1.Pod
	if err := k.w.c.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil {
		return 0, "", err
	}
	out, _ := os.ReadFile(filepath.Join(k.root, string(p.UID), "main.log"))
	m := sizeLine.FindAllStringSubmatch(string(out), -1)
	if len(m) == 0 {
		return 0, "", fmt.Errorf("pod %s, no df line yet in %q", p.Status.Phase, out)
	}
	n, _ := strconv.ParseInt(m[len(m)-1][1], 10, 64)
	return n << 10, m[len(m)-1][2], nil
}

// testBlockExpand: a block volume published on node-1 grows without a file system step:
// after ControllerExpandVolume and NodeExpandVolume its device, as the pod's target path
// shows it, is the new size (NodeGetVolumeStats too), bytes written before are intact and
// the grown end takes writes; every replica holds the same bytes afterwards.
func (w *world) testBlockExpand(t *testing.T) {
	ctx := context.Background()
	conn := w.dial(t)
	cc, nc := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	block := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	created, err := cc.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               "block-expand",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 16 * mib},
		Parameters:         map[string]string{driver.ParamReplicaCount: w.replicaEverywhere(t)},
		VolumeCapabilities: []*csi.VolumeCapability{block},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := created.Volume.VolumeId
	t.Cleanup(func() {
		if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("DeleteVolume: %v", err)
		}
	})
	testenv.RequireMounts(t)
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	if err := os.Mkdir(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: block}); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	unstaged := false
	unstage := func() {
		if unstaged {
			return
		}
		unstaged = true
		if _, err := nc.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Errorf("NodeUnpublishVolume: %v", err)
		}
		if _, err := nc.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Errorf("NodeUnstageVolume: %v", err)
		}
	}
	t.Cleanup(unstage)
	if _, err := nc.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: block}); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	size := func() int64 {
		t.Helper()
		f, err := os.Open(target)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		n, err := f.Seek(0, io.SeekEnd)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	statsTotal := func() int64 {
		t.Helper()
		resp, err := nc.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
		if err != nil || len(resp.Usage) != 1 || resp.Usage[0].Unit != csi.VolumeUsage_BYTES {
			t.Fatalf("NodeGetVolumeStats of the block volume: %+v, %v; want its bytes", resp, err)
		}
		return resp.Usage[0].Total
	}
	if n, s := size(), statsTotal(); n != 16*mib || s != 16*mib {
		t.Fatalf("block device %d bytes, stats %d; want 16Mi", n, s)
	}
	dev, err := os.OpenFile(target, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	head := make([]byte, mib)
	_, _ = rand.Read(head)
	if _, err := dev.WriteAt(head, 0); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := cc.ControllerExpandVolume(cctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 32 * mib}, VolumeCapability: block}); err != nil {
		t.Fatalf("ControllerExpandVolume to 32Mi: %v", err)
	}
	for i := range 2 {
		resp, err := nc.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, CapacityRange: &csi.CapacityRange{RequiredBytes: 32 * mib}, VolumeCapability: block})
		if err != nil || resp.CapacityBytes != 32*mib {
			t.Fatalf("NodeExpandVolume to 32Mi (call %d): %+v, %v", i+1, resp, err)
		}
	}
	if n, s := size(), statsTotal(); n != 32*mib || s != 32*mib {
		t.Fatalf("after the growth: block device %d bytes, stats %d; want 32Mi", n, s)
	}
	tail := make([]byte, mib)
	_, _ = rand.Read(tail)
	if _, err := dev.WriteAt(tail, 30*mib); err != nil {
		t.Fatalf("writing into the grown end: %v", err)
	}
	if err := dev.Sync(); err != nil {
		t.Fatal(err)
	}
	for off, want := range map[int64][]byte{0: head, 30 * mib: tail} {
		got := make([]byte, len(want))
		if _, err := dev.ReadAt(got, off); err != nil || !bytes.Equal(got, want) {
			t.Errorf("reading back at %d: %v (equal: %v)", off, err, bytes.Equal(got, want))
		}
	}
	dev.Close()
	unstage()
	w.sameReplicas(t, id)
}
