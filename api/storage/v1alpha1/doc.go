// Package v1alpha1 contains the storage.crdipc.io API, version v1alpha1: StoragePoolClaim, CStorPool, CStorVolume and CStorVolumeReplica, the operator/agent storage system of seed 000.
//
// +kubebuilder:object:generate=true
// +groupName=storage.crdipc.io
package v1alpha1
