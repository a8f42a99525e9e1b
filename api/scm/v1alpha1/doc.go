// Package v1alpha1 contains the scm.crdipc.io API, version v1alpha1: PullRequest and Branch, written by the GitHub webhook listener of seed 003.
//
// +kubebuilder:object:generate=true
// +groupName=scm.crdipc.io
package v1alpha1
