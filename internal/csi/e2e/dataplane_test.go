package e2e_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/sidecar"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/metrics"
)

// nodePlugin is a CSI driver instance serving the Node service of one node, as the node
// plugin DaemonSet runs one per node.
type nodePlugin struct {
	node string
	nc   csi.NodeClient
	dir  string // staging and target paths live here
	d    *driver.Driver
}

// startNodePlugin runs a driver for node on a socket of its own, as its ServiceAccount.
func (w *world) startNodePlugin(t *testing.T, node string) *nodePlugin {
	t.Helper()
	p, _ := w.startNodePluginWith(t, node, nil)
	return p
}

// startNodePluginWith is startNodePlugin with opt changing the driver's options; stop ends
// the driver (as SIGTERM does a node plugin's) and is idempotent.
func (w *world) startNodePluginWith(t *testing.T, node string, opt func(*driver.Options)) (p *nodePlugin, stop func()) {
	t.Helper()
	return w.startNodePluginServing(t, node, opt, nil, nil)
}

// startNodePluginServing is startNodePluginWith serving on wrap(its listener) (nil: the
// listener itself); served, when set, gets what serving returned instead of a non-nil
// error failing the test.
func (w *world) startNodePluginServing(t *testing.T, node string, opt func(*driver.Options), wrap func(net.Listener) net.Listener, served func(error)) (p *nodePlugin, stop func()) {
	t.Helper()
	sock, err := os.MkdirTemp("", "csi-"+node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sock) })
	endpoint := "unix://" + filepath.Join(sock, "csi.sock")
	o := driver.Options{Config: impersonate(w.env.Config, driverSA), DataConfig: boundTo(node), NodeID: node, TargetDir: filepath.Join(w.root, "targets", node), KubeletRoot: os.TempDir(),
		LocalReplicaSocket: w.cluster.LocalReplicaSocket(node)}
	if opt != nil {
		opt(&o)
	}
	d, err := driver.New(o)
	if err != nil {
		t.Fatal(err)
	}
	l, err := driver.Listen(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		l = wrap(l)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := d.ServeListener(ctx, l)
		if served != nil {
			served(err)
		} else if err != nil {
			t.Errorf("driver of %s: %v", node, err)
		}
	}()
	conn, err := sidecar.Dial(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() { once.Do(func() { _ = conn.Close(); cancel(); <-done }) }
	t.Cleanup(stop)
	return &nodePlugin{node: node, nc: csi.NewNodeClient(conn), dir: t.TempDir(), d: d}, stop
}

// mount stages and publishes volume id (ext4) on the plugin's node and returns the target
// directory; the returned function unpublishes and unstages it.
func (p *nodePlugin) mount(t *testing.T, id string) (string, func()) {
	t.Helper()
	ctx := context.Background()
	staging, target := filepath.Join(p.dir, id, "staging"), filepath.Join(p.dir, id, "target")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	c := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := p.nc.NodeStageVolume(sctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: c}); err != nil {
		t.Fatalf("NodeStageVolume of %s on %s: %v", id, p.node, err)
	}
	if _, err := p.nc.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: c}); err != nil {
		t.Fatalf("NodePublishVolume of %s on %s: %v", id, p.node, err)
	}
	done := false
	unmount := func() {
		t.Helper()
		if done {
			return
		}
		done = true
		if _, err := p.nc.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatalf("NodeUnpublishVolume of %s on %s: %v", id, p.node, err)
		}
		if _, err := p.nc.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatalf("NodeUnstageVolume of %s on %s: %v", id, p.node, err)
		}
	}
	t.Cleanup(unmount)
	return target, unmount
}

// testDataPlane: a volume with a replica on every node is written on node-1; losing a
// replica's node leaves it Degraded but writable; a node joining gets a new replica, rebuilt
// while the volume stays in use, and the volume is Healthy again; after unstaging every
// replica file holds the same bytes; another node reads every file back, and still does once
// the node of the writer's own replica is gone too.
func (w *world) testDataPlane(t *testing.T) {
	testenv.RequireMounts(t)
	ctx := context.Background()
	conn, err := sidecar.Dial(w.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var pools storagev1alpha1.CStorPoolList
	if err := w.c.List(ctx, &pools); err != nil {
		t.Fatal(err)
	}
	nodes := map[string]bool{}
	for _, p := range pools.Items {
		if p.Status.Phase == storagev1alpha1.PoolPhaseHealthy {
			nodes[p.Spec.NodeName] = true
		}
	}
	rf := len(nodes) // a replica on every node: losing one leaves no pool to move it to
	if rf < 3 {
		t.Fatalf("%d healthy pools, want at least 3", rf)
	}
	created, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               "data-plane",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 64 * mib},
		Parameters:         map[string]string{driver.ParamReplicaCount: strconv.Itoa(rf)},
		VolumeCapabilities: []*csi.VolumeCapability{mountRWO()},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := created.Volume.VolumeId
	vol := w.volume(t, id)
	cf := int(vol.Spec.EffectiveConsistencyFactor())

	node1 := &nodePlugin{node: "node-1", nc: csi.NewNodeClient(conn), dir: t.TempDir()}
	dir, unmount := node1.mount(t, id)
	files := map[string]string{} // name → sha256
	write := func(n int) {
		t.Helper()
		for i := range n {
			data := make([]byte, 64<<10+i*4096)
			_, _ = rand.Read(data)
			name := fmt.Sprintf("f%03d", len(files))
			if err := writeFileSync(filepath.Join(dir, name), data); err != nil {
				t.Fatalf("writing %s: %v", name, err)
			}
			sum := sha256.Sum256(data)
			files[name] = hex.EncodeToString(sum[:])
		}
	}
	write(10)
	// node-1's target reached the replica on its node over the pool agent's local socket
	// (the world's node-1 driver reports to controller-runtime's registry).
	if n, _ := metrics.Gather(t, ctrlmetrics.Registry).Sample("crdipc_csi_local_replica_connections_total", map[string]string{"link": "socket"}); n < 1 {
		t.Errorf("node-1's target opened %v connections to its node's replica over the local socket, want at least 1", n)
	}
	// ... and read it through a descriptor of its file, never over the socket.
	reads := metrics.Gather(t, ctrlmetrics.Registry)
	if n, _ := reads.Sample("crdipc_csi_local_replica_sessions_total", map[string]string{"reads": "file"}); n < 1 {
		t.Errorf("node-1's target read its node's replica through its file in %v sessions, want at least 1", n)
	}
	if n, _ := reads.Sample("crdipc_csi_local_replica_sessions_total", map[string]string{"reads": "socket"}); n != 0 {
		t.Errorf("node-1's target read its node's replica over the socket in %v sessions, want 0 (the pool agent hands out the file)", n)
	}

	// Lose a replica's node (not node-1's, whose target writes): the volume is Degraded,
	// with consistencyFactor replicas still Healthy, and writes go on.
	var lost string
	for _, r := range vol.Status.Replicas {
		if r.Node != "node-1" {
			lost = r.Node
			break
		}
	}
	if err := w.c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: lost}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the volume Degraded without "+lost, func(ctx context.Context) (bool, error) {
		v := w.volume(t, id)
		if v.Status.Phase != storagev1alpha1.VolumePhaseDegraded || int(v.Status.ReadyReplicas) != rf-1 || onNode(v, lost) {
			return false, fmt.Errorf("%s, %d ready: %+v", v.Status.Phase, v.Status.ReadyReplicas, v.Status.Replicas)
		}
		return true, nil
	})
	// Its health says so, to the CO and to the node's kubelet, with a message.
	w.wantHealth(t, conn, id, csi.VolumeHealthErrorType_DEGRADED, driver.HealthDegraded, fmt.Sprintf("%d of %d replicas healthy", rf-1, rf))
	write(10) // the first writes find the replica gone and leave it; the rest need cf acks
	if rf-1 < cf {
		t.Fatalf("rf %d, cf %d: the test needs writes to go on with one replica lost", rf, cf)
	}

	// A node joins: a replica is placed there and rebuilt from the others while the volume
	// stays staged, then the volume is Healthy again.
	joined := "node-joined"
	w.addNode(joined, rf)
	testenv.Eventually(t, 60*time.Second, "the volume Healthy with a rebuilt replica on "+joined, func(ctx context.Context) (bool, error) {
		v := w.volume(t, id)
		if v.Status.Phase != storagev1alpha1.VolumePhaseHealthy || !onNode(v, joined) {
			return false, fmt.Errorf("%s: %+v", v.Status.Phase, v.Status.Replicas)
		}
		return true, nil
	})
	w.wantHealth(t, conn, id, 0, "", "")
	write(5)
	unmount()
	w.sameReplicas(t, id)

	// Another node reads every file back: the volume's target runs wherever it is staged.
	reader := ""
	for _, r := range w.volume(t, id).Status.Replicas {
		if r.Node != "node-1" && r.Node != joined {
			reader = r.Node
		}
	}
	node2 := w.startNodePlugin(t, reader)
	dir2, unmount2 := node2.mount(t, id)
	w.checkFiles(t, dir2, files)
	unmount2()

	// The writer's own node goes too: the others still hold everything.
	if err := w.c.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("the volume without node-1, %d replicas ready", rf-1), func(ctx context.Context) (bool, error) {
		v := w.volume(t, id)
		if onNode(v, "node-1") || int(v.Status.ReadyReplicas) != rf-1 {
			return false, fmt.Errorf("%s, %d ready: %+v", v.Status.Phase, v.Status.ReadyReplicas, v.Status.Replicas)
		}
		return true, nil
	})
	dir2, unmount2 = node2.mount(t, id)
	w.checkFiles(t, dir2, files)
	unmount2()
	w.sameReplicas(t, id)
}

func (w *world) volume(t *testing.T, id string) *storagev1alpha1.CStorVolume {
	t.Helper()
	var v storagev1alpha1.CStorVolume
	if err := w.c.Get(context.Background(), client.ObjectKey{Namespace: install.SystemNamespace, Name: id}, &v); err != nil {
		t.Fatal(err)
	}
	return &v
}

// onNode reports whether v has a replica on node.
func onNode(v *storagev1alpha1.CStorVolume, node string) bool {
	for _, r := range v.Status.Replicas {
		if r.Node == node {
			return true
		}
	}
	return false
}

// sameReplicas checks that every current replica file of volume id holds the same bytes.
func (w *world) sameReplicas(t *testing.T, id string) {
	t.Helper()
	v := w.volume(t, id)
	sums := map[string][]string{}
	for _, r := range v.Status.Replicas {
		if r.Location == "" {
			t.Fatalf("replica %s of %s reports no location", r.Name, id)
		}
		s := testenv.SHA256File(t, r.Location)
		sums[s] = append(sums[s], r.Name)
	}
	if len(sums) != 1 {
		t.Fatalf("the replicas of %s differ: %v", id, sums)
	}
}

// checkFiles reads every file back from dir and compares its sha256.
func (w *world) checkFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, want := range files {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatalf("reading %s back: %v", name, err)
		}
		sum := sha256.Sum256(data)
		if got := hex.EncodeToString(sum[:]); got != want {
			t.Fatalf("%s: sha256 %s, want %s", name, got, want)
		}
	}
}

// wantHealth waits until the health of volume id, as ControllerGetVolumeHealth and
// NodeGetVolumeHealth of node-1 (where it is staged) report it, holds an entry of type typ
// and reason whose message holds msg, or, for reason "", no adverse entry at all.
func (w *world) wantHealth(t *testing.T, conn *grpc.ClientConn, id string, typ csi.VolumeHealthErrorType, reason, msg string) {
	t.Helper()
	what := fmt.Sprintf("the health of %s: %s %s %q", id, typ, reason, msg)
	if reason == "" {
		what = "no adverse health entry for " + id
	}
	testenv.Eventually(t, 20*time.Second, what, func(ctx context.Context) (bool, error) {
		c, err := csi.NewControllerClient(conn).ControllerGetVolumeHealth(ctx, &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
		if err != nil {
			return false, fmt.Errorf("ControllerGetVolumeHealth: %w", err)
		}
		n, err := csi.NewNodeClient(conn).NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: id})
		if err != nil {
			return false, fmt.Errorf("NodeGetVolumeHealth: %w", err)
		}
		for who, h := range map[string]*csi.VolumeHealth{"controller": c.GetVolumeHealth(), "node": n.GetVolumeHealth()} {
			found := false
			for _, e := range h.GetHealthStatuses() {
				found = found || (e.GetStatus() == typ && e.GetReason() == reason && strings.Contains(e.GetMessage(), msg))
			}
			switch {
			case h.GetVolumeId() != id:
				return false, fmt.Errorf("%s health names volume %q", who, h.GetVolumeId())
			case reason == "" && len(h.GetHealthStatuses()) != 0, reason != "" && !found:
				return false, fmt.Errorf("%s health: %+v", who, h.GetHealthStatuses())
			}
		}
		return true, nil
	})
}
