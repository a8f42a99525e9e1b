package cli

import (
	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/crdipc/crdipc/internal/csi/driver"
	"github.com/crdipc/crdipc/internal/csi/sidecar"
)

func newCSISidecarCommand() *cobra.Command {
	var (
		so serviceOptions
		o  sidecar.Options
	)
	cmd := &cobra.Command{
		Use:   "csi-sidecar",
		Short: "Watch PVCs and VolumeAttachments for the CSI driver (seed 001)",
		Long: `csi-sidecar watches the Kubernetes API on the CSI driver's behalf and calls the
driver over its Unix socket: a PVC of a StorageClass whose provisioner is the driver
becomes CreateVolume and a PV bound to the claim; a released PV with reclaim policy Delete
becomes DeleteVolume (never while a VolumeAttachment references it); VolumeAttachments of
the driver become ControllerPublish/ControllerUnpublish. Retryable gRPC codes are retried
with exponential backoff (1 s doubling to 5 min); final codes become Warning Events.

Run two replicas for availability: leader election lets only one act.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return runService("csi-sidecar", so, func(mgr manager.Manager) error { return sidecar.Add(mgr, o) })
		},
	}
	so.flags(cmd)
	cmd.Flags().StringVar(&o.DriverEndpoint, "driver-endpoint", "unix:///var/lib/crdipc/csi/csi.sock", "the CSI driver's Unix socket (a relative path is taken from the working directory)")
	cmd.Flags().StringVar(&o.DriverName, "driver-name", driver.Name, "the name the driver reports; its StorageClasses' provisioner ('' learns it from the driver, serving nothing until the driver answers)")
	cmd.Flags().DurationVar(&o.CallTimeout, "timeout", 0, "timeout of one CSI call (default 10s)")
	return cmd
}
