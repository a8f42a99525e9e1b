// Package snapshotcontroller runs upstream's snapshot controller (the "common controller" of
// github.com/kubernetes-csi/external-snapshotter) as a crdipc service: it binds each
// VolumeSnapshot to a VolumeSnapshotContent — creating the content of a dynamically taken
// snapshot from the snapshot's class and the PVC's bound PV — and reports the content's state
// on the VolumeSnapshot. The CSI side (CreateSnapshot over the driver's socket) is the
// sidecar's (package sidecar), as upstream splits it between snapshot-controller and
// csi-snapshotter.
//
// The library is used as upstream's own binary uses it, so VolumeSnapshot objects behave as
// on any cluster: the same finalizers, annotations, Events and error messages.
package snapshotcontroller
