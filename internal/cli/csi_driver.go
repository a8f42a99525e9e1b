package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/sidecar"
	"github.com/crdipc/crdipc/internal/install"
)

func newCSIDriverCommand() *cobra.Command {
	var (
		kubeconfig, endpoint, httpAddr string
		o                              driver.Options
	)
	cmd := &cobra.Command{
		Use:   "csi-driver",
		Short: "Run the CSI driver on a Unix socket (seed 001)",
		Long: `csi-driver serves the CSI Identity, Controller and Node services over gRPC on a
Unix socket. CreateVolume creates a CStorVolume (storage.crdipc.io) and waits until the
storage operator reports it Ready; DeleteVolume deletes it. The driver's only Kubernetes
access is the storage.crdipc.io kinds: the csi-sidecar watches PVCs, PVs and
VolumeAttachments for it and calls it over the socket.

--http-bind-address serves /healthz, /readyz (ready when the driver can list
CStorVolumes, as its CSI Probe says) and /metrics with
crdipc_csi_operations_seconds{method,grpc_status_code}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := absolute(&o.TargetDir); err != nil {
				return err
			}
			endpoint, err := driver.Endpoint(endpoint)
			if err != nil {
				return err
			}
			cfg, err := restConfig(kubeconfig)
			if err != nil {
				return err
			}
			o.Config = cfg
			d, err := driver.New(o)
			if err != nil {
				return err
			}
			ctx := ctrl.SetupSignalHandler()
			if httpAddr == "0" {
				return d.Serve(ctx, endpoint)
			}
			g, ctx := errgroup.WithContext(ctx)
			g.Go(func() error { return d.Serve(ctx, endpoint) })
			g.Go(func() error { return serveHTTP(ctx, httpAddr, d.Handler(ctrlmetrics.Registry)) })
			return g.Wait()
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
	cmd.Flags().StringVar(&endpoint, "endpoint", "unix:///var/lib/crdipc/csi/csi.sock", "Unix socket to serve CSI on")
	cmd.Flags().StringVar(&o.NodeID, "node-id", "", "node this instance serves for the Node service (empty: controller only)")
	cmd.Flags().StringVar(&o.TargetDir, "target-dir", "/var/lib/crdipc/csi/targets", "where the Node service mounts the FUSE files of the volumes it stages (one directory per volume)")
	cmd.Flags().StringVar(&o.Namespace, "namespace", install.SystemNamespace, "namespace of the CStorVolumes the driver creates")
	cmd.Flags().StringVar(&httpAddr, "http-bind-address", ":9808", "address for /healthz, /readyz (the CSI Probe) and Prometheus /metrics ('0' disables)")
	return cmd
}

// StorageClassName is the StorageClass `crdipc up` installs for the driver.
const StorageClassName = "crdipc"

// csiStorageClass is the StorageClass `crdipc up` installs: 3 replicas, deleted with the
// claim, bound at once (no scheduler runs in up, so WaitForFirstConsumer would never bind).
func csiStorageClass() *storagev1.StorageClass {
	return &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: StorageClassName},
		Provisioner:       driver.Name,
		Parameters:        map[string]string{driver.ParamReplicaCount: "3"},
		ReclaimPolicy:     ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate),
	}
}

// startCSI prepares the CSI driver and sidecar of `crdipc up`: it installs the StorageClass
// crdipc, opens the driver's socket under dataDir/csi, and adds the sidecar (which dials
// that socket) to mgr. The caller runs the returned function until shutdown, next to
// mgr.Start. The driver serves Node calls for nodeID, staging volumes under
// dataDir/csi/targets/<nodeID>; it is returned so that the node's own Node service socket
// (package nodeservice) serves the same instance.
func startCSI(ctx context.Context, cfg *rest.Config, mgr manager.Manager, dataDir, nodeID string) (d *driver.Driver, serveDriver func(context.Context) error, endpoint string, err error) {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return nil, nil, "", fmt.Errorf("csi: %w", err)
	}
	if err := c.Create(ctx, csiStorageClass()); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, nil, "", fmt.Errorf("csi: installing StorageClass %s: %w", StorageClassName, err)
	}
	endpoint, err = driver.Endpoint(filepath.Join(dataDir, "csi", "csi.sock"))
	if err != nil {
		return nil, nil, "", err
	}
	d, err = driver.New(driver.Options{Config: cfg, NodeID: nodeID, TargetDir: filepath.Join(dataDir, "csi", "targets", nodeID)})
	if err != nil {
		return nil, nil, "", err
	}
	l, err := driver.Listen(endpoint)
	if err != nil {
		return nil, nil, "", err
	}
	if err := sidecar.Add(mgr, sidecar.Options{DriverEndpoint: endpoint, DriverName: driver.Name}); err != nil {
		l.Close()
		return nil, nil, "", err
	}
	return d, func(ctx context.Context) error { return d.ServeListener(ctx, l) }, endpoint, nil
}

// serveHTTP serves h on addr until ctx ends.
func serveHTTP(ctx context.Context, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving %s: %w", addr, err)
	}
	return nil
}
