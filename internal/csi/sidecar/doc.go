// Package sidecar is the Kubernetes side of crdipc's CSI driver (seed 001): the component
// that watches the Kubernetes API on the driver's behalf, so the control plane never talks to
// the (untrusted) driver's socket and the driver never needs PVC, PV or VolumeAttachment
// permissions.
//
//   - The provisioner (built on sigs.k8s.io/sig-storage-lib-external-provisioner, the library
//     upstream's external-provisioner uses) turns PVCs of a StorageClass whose provisioner is
//     the driver into CreateVolume calls and PVs with a claimRef, and released PVs with reclaim
//     policy Delete into DeleteVolume calls — never while a VolumeAttachment references the
//     PV. A claim whose data source is a VolumeSnapshot of the driver (ready to use) or a bound
//     claim of the driver gets CreateVolume with that snapshot's handle or that volume's
//     handle as its content source (a restore, a clone), checked as upstream's
//     external-provisioner checks it: a source not usable yet is waited for, one that never
//     can be is a final failure. A clone's source claim is kept (upstream's finalizer
//     provisioner.storage.kubernetes.io/cloning-protection) until the clones started from
//     it are Bound, gone or failed for good; what was begun for a clone that is not
//     provisioned is deleted (provisioner_clone.go).
//   - The attacher turns VolumeAttachments whose attacher is the driver into
//     ControllerPublishVolume / ControllerUnpublishVolume calls and reports the outcome in the
//     VolumeAttachment's status.
//   - The resizer, as upstream's external-resizer, turns a raised request of a bound claim
//     into ControllerExpandVolume, the PV's new capacity and the claim's resize status
//     (allocatedResources, allocatedResourceStatuses NodeResizePending, condition
//     FileSystemResizePending), which the kubelet completes on the node.
//   - The snapshotter, for a driver that offers CREATE_DELETE_SNAPSHOT, is upstream's
//     csi-snapshotter controller (external-snapshotter's sidecar-controller) as a library:
//     VolumeSnapshotContents of the driver become CreateSnapshot / DeleteSnapshot calls and
//     their status (snapshot handle, restore size, readyToUse, errors).
//
// The provisioner, the attacher and the resizer retry only retryable gRPC codes (Unavailable,
// DeadlineExceeded, Aborted, Canceled, ResourceExhausted), with exponential backoff; a final
// code becomes a Warning Event carrying the driver's message and is not retried until the
// object changes. The snapshotter does as upstream's: every failure goes into the content's
// status and is retried with backoff.
package sidecar
