// Package v1alpha1 contains the bitcoin.crdipc.io API, version v1alpha1: BitcoinNetwork, the operator example of seed 002.
//
// +kubebuilder:object:generate=true
// +groupName=bitcoin.crdipc.io
package v1alpha1
