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
//
// The Node service offers STAGE_UNSTAGE_VOLUME: NodeStageVolume starts the volume's target
// on this node (the engine writing every replica over the data path) and presents it as a
// loop device over a FUSE file under the target directory; for mount access it makes a file
// system on it unless it has one (k8s.io/mount-utils FormatAndMount: blkid, mkfs, never a
// reformat) and mounts it nodev,nosuid on the staging path. NodePublishVolume bind-mounts
// the staging path (or, for block access, the loop device) onto the target, remounted
// nodev,nosuid (block: nosuid). Staging and target paths must lie inside the kubelet root,
// symbolic links followed; NodeUnpublishVolume and NodeUnstageVolume unmount only what is
// this volume's.
//
// Volumes grow online: ControllerExpandVolume raises the CStorVolume's capacity and awaits
// every replica grown; NodeExpandVolume grows the staged target, its loop device and the
// file system. NodeGetVolumeStats reports statfs of the mounted volume, and
// Controller/NodeGetVolumeHealth what the operator and the node's target know to be wrong.
// docs/csi.md says exactly what each call does.
package driver
