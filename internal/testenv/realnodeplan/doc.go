// Package realnodeplan is the address plan of the real nodes hack/realnode.sh joins to a
// `crdipc up` on this machine: the bridge and the host's address on it, each node's address,
// pod range and work directory, the cluster and Service ranges. test/realnode passes these to
// the script as flags, and the script's defaults come from here too (hack/realnode/nodeconfig
// prints them), so the Go and shell sides cannot disagree.
//
// Node N (1-MaxIndex) is real-N at 10.88.0.(10+N) on the bridge crdipc0, where the host is
// 10.88.0.1 (up's --advertise-address); its pods are in 10.88.N.0/24 and its containerd,
// kubelet and logs under /tmp/crdipc-rnN.
package realnodeplan
