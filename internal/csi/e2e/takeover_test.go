package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/storage/fdstore"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/metrics"
	"github.com/crdipc/crdipc/internal/testenv/records"
)

// testNodePluginTakeover: a block volume staged and published on node-2 is written by a
// writer that syncs every record, while node-2's node plugin is stopped and a new one
// started, twice, as a rollout of the DaemonSet without surge does; the fd holder keeps
// the volume's FUSE connection meanwhile. Then a new plugin starts while the last one still
// serves, as a surge pod does: it asks that one for the volume, which hands it over and
// serves nothing more, and stopping it afterwards leaves the successor's handover socket.
// Then the windows around a handover: the holder restarts just before a plugin stops (it
// holds nothing, and the plugin must give it the connection before it lets go of its own);
// the holder has a stale entry of the volume that sorts before the live one; a plugin's
// gRPC server fails (it releases the volume before it frees the serving lock).
// No write fails, each new plugin reports the takeover, every record is on the volume, and
// unstaging through the last plugin leaves the holder empty.
// holdsReplica reports whether node holds a replica of volume id.
func (w *world) holdsReplica(t *testing.T, id, node string) bool {
	t.Helper()
	for _, r := range w.volume(t, id).Status.Replicas {
		if r.Node == node {
			return true
		}
	}
	t.Logf("volume %s has no replica on %s: its local link is not checked", id, node)
	return false
}

func (w *world) testNodePluginTakeover(t *testing.T) {
	testenv.RequireMounts(t)
	ctx := context.Background()
	const node = "node-2"
	holderSock := filepath.Join(t.TempDir(), "fd.sock")
	var holder *fdstore.Store
	var stopHolder func()
	startHolder := func() {
		l, err := fdstore.Listen(holderSock)
		if err != nil {
			t.Fatal(err)
		}
		holder = fdstore.New(slog.New(slog.DiscardHandler))
		hctx, cancel := context.WithCancel(ctx)
		served := make(chan struct{})
		go func() { defer close(served); _ = holder.Serve(hctx, l) }()
		h := holder
		stopHolder = func() { cancel(); <-served; h.Close() }
	}
	startHolder()
	t.Cleanup(func() { stopHolder() })

	targets, handover := filepath.Join(w.root, "targets", node), filepath.Join(w.root, "handover", node)
	var reg *prometheus.Registry
	startServing := func(wrap func(net.Listener) net.Listener, served func(error)) (*nodePlugin, func()) {
		reg = prometheus.NewRegistry()
		log := testr.NewWithOptions(t, testr.Options{Verbosity: 1})
		return w.startNodePluginServing(t, node, func(o *driver.Options) {
			o.FDHolder, o.TargetDir, o.HandoverDir, o.Registerer, o.Logger = holderSock, targets, handover, reg, &log
		}, wrap, served)
	}
	start := func() (*nodePlugin, func()) { return startServing(nil, nil) }
	p, stop := start()

	conn := w.dial(t)
	created, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               "takeover",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 64 * mib},
		Parameters:         map[string]string{driver.ParamReplicaCount: strconv.Itoa(2)},
		VolumeCapabilities: []*csi.VolumeCapability{blockRWO()},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := created.Volume.VolumeId
	staging, target := filepath.Join(p.dir, "staging"), filepath.Join(p.dir, "target")
	if err := os.Mkdir(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := p.nc.NodeStageVolume(sctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: blockRWO()}); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if _, err := p.nc.NodePublishVolume(sctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: blockRWO()}); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	export := filepath.Join(targets, id)
	wr, err := records.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	// A takeover that fails leaves the writer blocked on a connection this process holds:
	// abort it rather than hang.
	t.Cleanup(func() {
		if err := wr.Stop(time.Minute); err != nil {
			t.Errorf("writer: %v", err)
			if err := records.AbortFUSE(export); err != nil {
				t.Log(err)
			}
		}
	})
	acked := func(n int) {
		t.Helper()
		testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("%d records acknowledged", n), func(context.Context) (bool, error) {
			if err := wr.Err(); err != nil {
				t.Fatalf("a write failed: %v", err)
			}
			if got := wr.Acked(); got < n {
				return false, fmt.Errorf("%d acknowledged", got)
			}
			return true, nil
		})
	}
	tookOver := func(round int) {
		t.Helper()
		testenv.Eventually(t, 10*time.Second, "the new plugin counting its takeover", func(context.Context) (bool, error) {
			if got, _ := metrics.Gather(t, reg).Sample("crdipc_csi_volume_takeovers_total", nil); got != 1 {
				return false, fmt.Errorf("round %d: crdipc_csi_volume_takeovers_total %v, want 1", round, got)
			}
			return true, nil
		})
	}
	acked(50)
	for round := 1; round <= 2; round++ {
		before := wr.Acked()
		stop()
		p, stop = start()
		acked(before + 50)
		tookOver(round)
		if w.holdsReplica(t, id, node) {
			// The new process reached the replica on its node over the local socket only.
			got := metrics.Gather(t, reg)
			sock, _ := got.Sample("crdipc_csi_local_replica_connections_total", map[string]string{"link": "socket"})
			overTLS, _ := got.Sample("crdipc_csi_local_replica_connections_total", map[string]string{"link": "tls"})
			if sock < 1 || overTLS != 0 {
				t.Errorf("round %d: the new plugin reached %s's replica %v times over the local socket and %v over TLS, want only the socket", round, node, sock, overTLS)
			}
		}
	}
	// The surge: the old plugin runs until the new one has the volume.
	before := wr.Acked()
	next, stopNext := start()
	acked(before + 50)
	tookOver(3)
	if !p.d.HandedOver() {
		t.Error("the plugin the volume was taken from does not report that it handed it over")
	}
	stop()
	if _, err := os.Stat(filepath.Join(handover, "handover.sock")); err != nil {
		t.Errorf("the successor's handover socket, after its predecessor stopped: %v", err)
	}
	p, stop = next, stopNext
	acked(wr.Acked() + 20)

	// The holder restarts, and the plugin stops before its upkeep (every 5 s) gives the
	// new holder the connection: the release must give it first.
	stopHolder()
	startHolder()
	before = wr.Acked()
	stop()
	p, stop = start()
	acked(before + 50)
	tookOver(4)

	// A stale entry of the volume, sorting before the live one, of a connection that has
	// ended (here: a /dev/fuse descriptor never mounted). The live one is served, and the
	// stale one dropped.
	live := holder.Names()
	if len(live) != 1 {
		t.Fatalf("the fd holder keeps %v, want the volume's one entry", live)
	}
	dead, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	stale := "csi-target/" + id + "/loop"
	if err := (fdstore.Client{Path: holderSock}).Put(stale, dead); err != nil {
		t.Fatal(err)
	}
	unix.Close(dead)
	before = wr.Acked()
	stop()
	p, stop = start()
	acked(before + 50)
	tookOver(5)
	testenv.Eventually(t, 30*time.Second, "the stale entry dropped", func(context.Context) (bool, error) {
		if got := holder.Names(); !slices.Equal(got, live) {
			return false, fmt.Errorf("the fd holder keeps %v, want %v", got, live)
		}
		return true, nil
	})

	// The gRPC server fails: the plugin releases the volume, as on SIGTERM, before the
	// serving lock lets the next one take it.
	fail := make(chan struct{})
	servedErr := make(chan error, 1)
	stop()
	p, stop = startServing(func(l net.Listener) net.Listener { return &failingListener{Listener: l, fail: fail} },
		func(err error) { servedErr <- err })
	acked(wr.Acked() + 20)
	tookOver(6)
	before = wr.Acked()
	close(fail)
	select {
	case err := <-servedErr:
		if err == nil {
			t.Fatal("the plugin whose gRPC server failed returned no error")
		}
		t.Logf("the plugin whose gRPC server failed: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the plugin whose gRPC server failed still runs")
	}
	p, stop = start()
	acked(before + 50)
	tookOver(7)
	if err := wr.Stop(time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := wr.Err(); err != nil {
		t.Fatal(err)
	}
	n := wr.Acked()
	t.Logf("%d records through 5 node plugin restarts and a handover, the longest write+fsync %s", n, wr.MaxPause())
	dev, err := os.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	verr := records.Verify(dev, n)
	dev.Close()
	if verr != nil {
		t.Fatal(verr)
	}

	if _, err := p.nc.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatalf("NodeUnpublishVolume: %v", err)
	}
	if _, err := p.nc.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatalf("NodeUnstageVolume: %v", err)
	}
	if names := holder.Names(); len(names) != 0 {
		t.Errorf("the fd holder still keeps %v after the volume was unstaged", names)
	}
	if _, err := os.Stat(export); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the export directory %s: %v, want it gone", export, err)
	}
	if _, err := csi.NewControllerClient(conn).DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("DeleteVolume: %v", err)
	}
}

func blockRWO() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// failingListener fails Accept, as a broken socket would, once fail is closed: gRPC's Serve
// then returns that error.
type failingListener struct {
	net.Listener
	fail chan struct{}
}

func (l *failingListener) Accept() (net.Conn, error) {
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() { c, err := l.Listener.Accept(); ch <- accepted{c, err} }()
	select {
	case a := <-ch:
		return a.c, a.err
	case <-l.fail:
		return nil, errors.New("injected accept failure")
	}
}
