// Package v1alpha1 contains the scm.crdipc.io API, version v1alpha1: PullRequest and Branch, written by the GitHub webhook listener of seed 003, and Delivery, the listener's record of each webhook body it accepted.
//
// +kubebuilder:object:generate=true
// +groupName=scm.crdipc.io
package v1alpha1
