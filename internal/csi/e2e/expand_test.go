package e2e_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
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
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/nodeservice"
	"github.com/crdipc/crdipc/internal/csi/sidecar"
	"github.com/crdipc/crdipc/internal/podsim"
	"github.com/crdipc/crdipc/internal/podsim/busybox"
	"github.com/crdipc/crdipc/internal/testenv"
)

// ext4Online says why this process cannot grow a mounted ext4 file system (no
// CAP_SYS_RESOURCE, as on the CI machine, whose container lacks it even in its bounding
// set), or nil when it can. Under CRDIPC_REQUIRE_ONLINE_RESIZE=1, a host that must, it
// fails the test instead.
func ext4Online(t *testing.T) error {
	t.Helper()
	err := driver.OnlineResizeAvailable("ext4")
	if err != nil && os.Getenv("CRDIPC_REQUIRE_ONLINE_RESIZE") == "1" {
		t.Fatalf("CRDIPC_REQUIRE_ONLINE_RESIZE=1 but this host cannot grow a mounted ext4 file system: %v", err)
	}
	return err
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
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		if os.Getenv("CRDIPC_REQUIRE_MOUNT") == "1" {
			t.Fatalf("CRDIPC_REQUIRE_MOUNT=1 but neither ext4 (no CAP_SYS_RESOURCE) nor xfs (no mkfs.xfs: install xfsprogs) can grow online here")
		}
		t.Skipf("neither ext4 (no CAP_SYS_RESOURCE) nor xfs (no mkfs.xfs) can grow online here")
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

	t.Run("Grow", func(t *testing.T) { w.testNodeGrow(t, id, target, staging, data) })
	unmount()
	w.sameReplicas(t, id)
}

// testNodeGrow is the growth part of testNodeExpandAndStats, on volume id (32Mi) published
// at target, which holds the file "before" with data.
func (w *world) testNodeGrow(t *testing.T, id, target, staging string, data []byte) {
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
	sc := &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: class + "-" + fs.fsType},
		Provisioner:          driver.Name,
		Parameters:           map[string]string{driver.ParamReplicaCount: "3", "csi.storage.k8s.io/fstype": fs.fsType},
		ReclaimPolicy:        ptr.To(corev1.PersistentVolumeReclaimDelete),
		AllowVolumeExpansion: ptr.To(true),
	}
	if err := w.c.Create(ctx, sc); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.c.Delete(context.Background(), sc) })
	podRoot := t.TempDir()                      // inside the drivers' kubelet root, os.TempDir()
	csiDir, err := os.MkdirTemp("", "csi-pods") // socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(csiDir) })
	nodes, err := nodeservice.New(nodeservice.Options{Config: w.env.AsServiceAccount(t, "csi-node"), Dir: csiDir, KubeletRoot: podRoot})
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

	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "grows"},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: ptr.To(sc.Name),
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(fs.small)}},
		},
	}
	if err := w.c.Create(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	w.waitBound(t, pvc, 60*time.Second)
	script := `set -e
head -c 8388608 /dev/urandom > /data/before
sha256sum /data/before > /data/before.sha256
sync
echo started
while :; do
  echo "size $(df -kP /data | awk 'NR==2 {print $2}') $(sha256sum -c /data/before.sha256 >/dev/null 2>&1 && echo intact || echo BROKEN)"
  sleep 0.5
done`
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "df"},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			NodeSelector:                  map[string]string{corev1.LabelHostname: "node-2"},
			Containers: []corev1.Container{{
				Name: "main", Image: "busybox:1.36", Command: []string{"sh", "-c", script},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pvc.Name},
			}}},
		},
	}
	if err := w.c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Gone, and its volume unstaged, before the kubelet stops.
		_ = w.c.Delete(context.Background(), pod)
		testenv.Eventually(t, 60*time.Second, "the pod gone", func(ctx context.Context) (bool, error) {
			if err := w.c.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{}); !apierrors.IsNotFound(err) {
				return false, fmt.Errorf("get: %v", err)
			}
			return true, nil
		})
		_ = w.c.Delete(context.Background(), pvc)
	})
	var logFile string
	sizeLine := regexp.MustCompile(`size (\d+) (intact|BROKEN)\n`)
	lastSize := func() (int64, string, error) {
		var p corev1.Pod
		if err := w.c.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil {
			return 0, "", err
		}
		logFile = filepath.Join(podRoot, string(p.UID), "main.log")
		out, _ := os.ReadFile(logFile)
		m := sizeLine.FindAllStringSubmatch(string(out), -1)
		if len(m) == 0 {
			return 0, "", fmt.Errorf("pod %s, no df line yet in %q", p.Status.Phase, out)
		}
		n, _ := strconv.ParseInt(m[len(m)-1][1], 10, 64)
		return n << 10, m[len(m)-1][2], nil
	}
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
	testenv.Eventually(t, 30*time.Second, "the claim at "+fs.big+", its resize done", func(ctx context.Context) (bool, error) {
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
		if c.Cmp(resource.MustParse(fs.big)) != 0 || len(resizing) != 0 || len(pvc.Status.AllocatedResourceStatuses) != 0 {
			return false, fmt.Errorf("capacity %s, conditions %+v, allocatedResourceStatuses %v", c.String(), pvc.Status.Conditions, pvc.Status.AllocatedResourceStatuses)
		}
		return true, nil
	})
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
