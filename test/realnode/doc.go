// Package realnode is crdipc on real nodes: the image built without a Docker daemon
// (make image), three real kubelets with containerd and kube-proxy joined to `crdipc up`
// (hack/realnode.sh; each node in network and mount namespaces of its own), config/default
// deployed onto them as real pods with kubectl, and the flows a user runs on them: a pod
// scheduled by kube-scheduler whose logs kubectl reads, a Book, a webhook delivery through a
// Service to PullRequest, Event and metrics, a volume written by one pod and read back by
// another, and a 3-replica volume written by fio (--verify) while a node is lost for real,
// its lost replica rebuilt on a fourth node that joins, read back from a third.
//
// It needs root, a kernel that runs containers (overlay, bridge, veth, netfilter,
// namespaces) and the packages hack/realnode.sh installs; without them it skips, unless
// CRDIPC_REQUIRE_REAL_NODE=1 (set by CI), where a missing capability fails. Every address
// it uses is on this machine: the API server's advertise address, the nodes and their pods
// are on the bridge crdipc0 and the nodes' own bridges (10.88.0.0/16), with no route out.
package realnode
