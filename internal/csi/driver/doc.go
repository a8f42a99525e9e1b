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
// The Node service works on this node's replica file (the file backend's sparse file). It
// offers STAGE_UNSTAGE_VOLUME: for mount access NodeStageVolume makes a file system on the
// file unless it has one (k8s.io/mount-utils FormatAndMount: blkid, mkfs, never a reformat)
// and loop-mounts it on the staging path (mount(8) -o loop, whose loop device autoclears on
// unmount); NodePublishVolume bind-mounts the staging path onto the target. Block access
// stages nothing and bind-mounts the file onto the target. On a host that refuses to mount
// (mount(2) EPERM/EACCES, or no loop device), the file system is still made but the loop mount
// is skipped: the staging path gets LinkName, a symbolic link to the replica file, and the
// target gets the file itself at LinkName (bind-mounted where mount(2) is allowed, else
// linked). docs/csi.md says exactly what each call does.
package driver
