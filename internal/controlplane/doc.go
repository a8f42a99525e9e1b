// Package controlplane runs a real Kubernetes control plane inside the crdipc
// process: etcd (go.etcd.io/etcd/server/v3/embed), kube-apiserver and the
// kube-controller-manager controllers crdipc's flows need, all on loopback.
//
// It is what `crdipc up` runs and what integration tests start once per
// package (see internal/testenv). Nothing is downloaded: the components are
// compiled into the binary, which is why a fresh laptop needs one command.
//
// Process-wide state (feature gates, metrics registries, klog) means only one
// control plane may run in a process at a time; Start may be called again
// after Stop returns.
package controlplane
