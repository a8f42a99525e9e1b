package services

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/registration"
	"github.com/crdipc/crdipc/internal/csi/sidecar"
	"github.com/crdipc/crdipc/internal/csi/snapshotcontroller"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/simnode"
)

func csiDriverEntry() Entry {
	return Entry{
		Name:  "csi-driver",
		Short: "Run the CSI driver on a Unix socket (seed 001)",
		Long: `csi-driver serves the CSI Identity, Controller and Node services over gRPC on a
Unix socket. CreateVolume creates a CStorVolume (storage.crdipc.io) and waits until the
storage operator reports it Ready; DeleteVolume deletes it. The driver's only Kubernetes
access is the storage.crdipc.io kinds: the csi-sidecar watches PVCs, PVs and
VolumeAttachments for it and calls it over the socket.

--http-bind-address serves /healthz, /readyz (ready when the driver can list
CStorVolumes, as its CSI Probe says) and /metrics with
crdipc_csi_operations_seconds{method,grpc_status_code}.

A node plugin (--node-id) registers with the kubelet itself, as upstream's
csi-node-driver-registrar would: with --registration-dir (the kubelet's
/var/lib/kubelet/plugins_registry) it serves the kubelet's plugin-registration API on
<registration-dir>/csi.crdipc.io-reg.sock once its CSI socket answers, and reports
--kubelet-registration-path as the socket the kubelet dials. If the kubelet refuses the
driver, /healthz fails, so that a liveness probe restarts the container.

With --fd-holder a node plugin's volumes outlive its process: the holder keeps their FUSE
connections, and the next process serves them again. A process started while another one
serves the node (a DaemonSet rollout with maxSurge) first gets its data-path certificate,
then asks that one, on handover.sock next to --endpoint, to release the volumes (it stops
serving CSI, answers what it read, closes its replica sessions) and takes them over: the
volumes' I/O pauses for the handover only. A lock next to it (serving.lock) lets only one
process serve the node's volumes; the released process waits to be stopped. Only the
process that holds the lock binds the CSI socket and registers with the kubelet: until
then the kubelet's calls reach the one that serves.

In crdipc up the controller instance serves <data-dir>/csi/csi.sock, and each
simulated node's Node service runs with the simulated nodes (crdipc nodes), on
<data-dir>/csi/nodes/<node>/csi.sock. The controller socket relays Node calls to
node-1's node plugin, so a tool that dials one socket meets a whole driver:

  csi-sanity --csi.endpoint=.crdipc/csi/csi.sock`,
		Kind: Server,
		New: func() Service {
			return &csiDriverService{endpoint: "unix:///var/lib/crdipc/csi/csi.sock", httpAddr: ":9808"}
		},
	}
}

type csiDriverService struct {
	o                  driver.Options
	endpoint, httpAddr string
	// registrationDir and kubeletPath: registration with the kubelet (a node plugin only).
	registrationDir, kubeletPath string
}

func (s *csiDriverService) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&s.endpoint, "endpoint", s.endpoint, "Unix socket to serve CSI on")
	fs.StringVar(&s.o.NodeID, "node-id", "", "node this instance serves for the Node service (empty: controller only)")
	fs.StringVar(&s.o.TargetDir, "target-dir", "/var/lib/crdipc/csi/targets", "where the Node service mounts the FUSE files of the volumes it stages (one directory per volume)")
	fs.StringVar(&s.o.FDHolder, "fd-holder", "", "socket of crdipc fd-holder on this node, which keeps the staged volumes' FUSE connections while this process restarts, so that their I/O pauses instead of failing (empty: none; a restart fails every volume's I/O on the node). With it, a node plugin started while another serves the node (a DaemonSet's surge pod) asks that one to hand the volumes over, on handover.sock next to --endpoint")
	fs.StringVar(&s.o.LocalReplicaSocket, "local-replica-socket", "", "socket of this node's pool agent (its --local-socket, /var/lib/crdipc/local/replica.sock by default): the Node service's targets reach the replica on their own node there, without TLS, and over TLS when it cannot be used (empty: always over TLS)")
	fs.StringVar(&s.o.KubeletRoot, "kubelet-root", driver.DefaultKubeletRoot, "the kubelet's root directory (--root-dir): the Node service stages, publishes and unpublishes only paths inside it")
	fs.StringSliceVar(&s.o.ExtraRoots, "extra-root", nil, "more directories the Node service's paths may lie in besides --kubelet-root (e.g. "+os.TempDir()+" for csi-sanity's default paths)")
	fs.StringVar(&s.o.Namespace, "namespace", install.SystemNamespace, "namespace of the CStorVolumes the driver creates")
	fs.StringVar(&s.httpAddr, "http-bind-address", s.httpAddr, "address for /healthz, /readyz (the CSI Probe) and Prometheus /metrics ('0' disables)")
	fs.StringVar(&s.registrationDir, "registration-dir", "", "the kubelet's plugin registration directory (/var/lib/kubelet/plugins_registry): a node plugin registers with the kubelet through a socket there, and /healthz fails if the kubelet refuses it (empty: no registration; the kubelet must learn of the driver otherwise)")
	fs.StringVar(&s.kubeletPath, "kubelet-registration-path", "", "the CSI socket's absolute path on the host, which the kubelet is told to dial when the node plugin registers (default: --endpoint's path, right where the container sees the socket at its host path)")
}

func (s *csiDriverService) Setup(mgr manager.Manager, env Env) error {
	o, endpoint, httpAddr := s.o, s.endpoint, s.httpAddr
	registrationDir, kubeletPath := s.registrationDir, s.kubeletPath
	if env.Local != nil {
		// Controller only: the simulated nodes run the Node services, and node-1's answers
		// this socket's Node calls too (a tool that dials one socket meets a whole driver).
		// No kubelet to register with.
		o.NodeID, o.TargetDir, httpAddr = "", filepath.Join(env.Local.DataDir, "csi", "targets"), "0"
		o.FDHolder, o.LocalReplicaSocket = "", "" // serves no node
		registrationDir, kubeletPath = "", ""
		endpoint = filepath.Join(env.Local.DataDir, "csi", "csi.sock")
		if env.Local.Nodes > 0 {
			o.NodeRelay = filepath.Join(env.Local.DataDir, "csi", "nodes", simnode.NodeName(1), "csi.sock")
		}
	}
	switch {
	case registrationDir != "" && o.NodeID == "":
		return errors.New("--registration-dir needs --node-id: only a node plugin registers with the kubelet")
	case kubeletPath != "" && registrationDir == "":
		return errors.New("--kubelet-registration-path needs --registration-dir: it is what the driver tells the kubelet when it registers")
	case kubeletPath != "" && !filepath.IsAbs(kubeletPath):
		return fmt.Errorf("--kubelet-registration-path %q: want the CSI socket's absolute path on the host (a path, not a unix:// URL)", kubeletPath)
	}
	if err := Absolute(&o.TargetDir); err != nil {
		return err
	}
	endpoint, err := driver.Endpoint(endpoint)
	if err != nil {
		return err
	}
	if o.FDHolder != "" && o.NodeID != "" {
		// Next to the CSI socket, which a successor on this node (a DaemonSet's surge pod)
		// sees at the same path.
		sock, err := driver.SocketPath(endpoint)
		if err != nil {
			return err
		}
		o.HandoverDir = filepath.Dir(sock)
	}
	o.Config = env.Config
	o.TracerProvider = env.TracerProvider("csi-driver")
	d, err := driver.New(o)
	if err != nil {
		return err
	}
	var reg *registration.Server
	if registrationDir != "" {
		if kubeletPath == "" {
			if kubeletPath, err = driver.SocketPath(endpoint); err != nil {
				return err
			}
		}
		// It offers the driver to the kubelet once the CSI socket answers, and withdraws it
		// when the manager stops (or when serving CSI fails, which stops the manager).
		reg, err = registration.New(registration.Options{Dir: registrationDir, Name: driver.Name, Endpoint: kubeletPath, CSIEndpoint: endpoint})
		if err != nil {
			return err
		}
	}
	// Serve binds the socket itself, once this process may serve: a node plugin started
	// while another one serves the node (a surge pod) leaves that one's socket alone until
	// the volumes are handed over.
	if err := mgr.Add(runnableFunc(func(ctx context.Context) error { return d.Serve(ctx, endpoint) })); err != nil {
		return err
	}
	if o.NodeRelay != "" {
		env.say("csi      %s (Identity, Controller; Node relayed to %s's node plugin)", endpoint, simnode.NodeName(1))
	} else {
		env.say("csi      %s", endpoint)
	}
	h := d.Handler(ctrlmetrics.Registry)
	if reg != nil {
		// Registered only once this process serves: the socket that answers before is a
		// predecessor's, and replacing its registration would fail its /healthz.
		if err := mgr.Add(runnableFunc(func(ctx context.Context) error {
			select {
			case <-d.Serving():
			case <-ctx.Done():
				return nil
			}
			return reg.Start(ctx)
		})); err != nil {
			return err
		}
		h = handedOver(d, reg.Healthz(h), h)
	}
	if httpAddr == "0" {
		return nil
	}
	hl, err := env.listen("csi-driver http", httpAddr)
	if err != nil {
		return err
	}
	return mgr.Add(&HTTPServer{Name: "csi-driver http", Listener: hl, Handler: h})
}

func csiSidecarEntry() Entry {
	return Entry{
		Name:  "csi-sidecar",
		Short: "Watch PVCs and VolumeAttachments for the CSI driver (seed 001)",
		Long: `csi-sidecar watches the Kubernetes API on the CSI driver's behalf and calls the
driver over its Unix socket: a PVC of a StorageClass whose provisioner is the driver
becomes CreateVolume and a PV bound to the claim; a released PV with reclaim policy Delete
becomes DeleteVolume (never while a VolumeAttachment references it); VolumeAttachments of
the driver become ControllerPublish/ControllerUnpublish. Retryable gRPC codes are retried
with exponential backoff (1 s doubling to 5 min); final codes become Warning Events.

Run two replicas for availability: leader election lets only one act.`,
		Kind: Controllers,
		New: func() Service {
			return &csiSidecarService{o: sidecar.Options{DriverEndpoint: "unix:///var/lib/crdipc/csi/csi.sock", DriverName: driver.Name}}
		},
	}
}

type csiSidecarService struct{ o sidecar.Options }

func (s *csiSidecarService) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&s.o.DriverEndpoint, "driver-endpoint", s.o.DriverEndpoint, "the CSI driver's Unix socket (a relative path is taken from the working directory)")
	fs.StringVar(&s.o.DriverName, "driver-name", s.o.DriverName, "the name the driver reports; its StorageClasses' provisioner ('' learns it from the driver, serving nothing until the driver answers)")
	fs.DurationVar(&s.o.CallTimeout, "timeout", 0, "timeout of one CSI call (default 10s)")
}

func (s *csiSidecarService) Setup(mgr manager.Manager, env Env) error {
	o := s.o
	if env.Local != nil {
		o.DriverEndpoint = filepath.Join(env.Local.DataDir, "csi", "csi.sock")
	}
	o.TracerProvider = env.TracerProvider("csi-sidecar")
	return sidecar.Add(mgr, o)
}

func snapshotControllerEntry() Entry {
	return Entry{
		Name:  "snapshot-controller",
		Short: "Bind VolumeSnapshots to VolumeSnapshotContents (upstream's snapshot controller)",
		Long: `snapshot-controller is upstream's snapshot controller (kubernetes-csi/external-snapshotter),
run as a crdipc service: a VolumeSnapshot of a bound PVC gets a VolumeSnapshotContent made
from its VolumeSnapshotClass and the PVC's PV, which the CSI driver's sidecar then takes
(CreateSnapshot); the content's state (readyToUse, restoreSize, errors) is reported on the
VolumeSnapshot. Deleting a VolumeSnapshot deletes its content as the class's
deletionPolicy says. The VolumeSnapshot CRDs are upstream's, installed by crdipc install.

Run two replicas for availability: leader election lets only one act.`,
		Kind: Controllers,
		New:  func() Service { return &snapshotControllerService{} },
	}
}

type snapshotControllerService struct{ o snapshotcontroller.Options }

func (s *snapshotControllerService) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&s.o.Workers, "workers", 10, "snapshots and contents worked on at once")
	fs.DurationVar(&s.o.Resync, "resync-period", 15*time.Minute, "how often every snapshot and content is looked at again")
	fs.DurationVar(&s.o.RetryStart, "retry-interval-start", time.Second, "first retry delay of a failed snapshot or content; doubles on each failure")
	fs.DurationVar(&s.o.RetryMax, "retry-interval-max", 5*time.Minute, "largest retry delay")
}

func (s *snapshotControllerService) Setup(mgr manager.Manager, _ Env) error {
	return snapshotcontroller.Add(mgr, s.o)
}

// handedOver serves plain instead of next once d has handed its volumes to a successor: the
// successor has replaced the registration socket, which next's /healthz would take for a
// failure, and a restart of this container would only take the volumes back.
func handedOver(d *driver.Driver, next, plain http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d.HandedOver() {
			plain.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}
