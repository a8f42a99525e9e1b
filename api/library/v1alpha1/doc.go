// Package v1alpha1 contains the library.crdipc.io API, version v1alpha1: Book, the plain request/response example of seed 002.
//
// +kubebuilder:object:generate=true
// +groupName=library.crdipc.io
package v1alpha1
