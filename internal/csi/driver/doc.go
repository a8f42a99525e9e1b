// Package driver is crdipc's CSI driver (seed 001): the Identity, Controller and Node services
// of the Container Storage Interface, served over gRPC on a Unix socket.
//
// The driver is not Kubernetes-aware in the CSI sense: it never reads PVCs, PVs or
// VolumeAttachments (the sidecar does that on its behalf). Its only Kubernetes access is the
// storage.crdipc.io kinds: CreateVolume creates a CStorVolume and awaits it with ipc.Await, so
// the driver-to-storage hop is again a custom resource used as a request.
//
// Every call is idempotent as the CSI spec requires. The CSI volume name maps to a
// deterministic CStorVolume name, so a call retried after a timeout or a driver restart finds
// the volume the first call created instead of creating a second one.
package driver
