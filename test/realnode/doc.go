// Package realnode is crdipc on a real node: the image built without a Docker daemon
// (make image), a real kubelet with containerd and kube-proxy joined to `crdipc up`
// (hack/realnode.sh), config/default deployed onto it as real pods with kubectl, and the
// flows a user runs on it: a pod scheduled by kube-scheduler whose logs kubectl reads,
// a Book, a webhook delivery through a Service to PullRequest, Event and metrics, a volume
// written by one pod and read back by another, and the node turning Unknown once its
// kubelet is gone.
//
// It needs root, a kernel that runs containers (overlay, bridge, veth, netfilter) and
// the packages hack/realnode.sh installs; without them it skips, unless
// CRDIPC_REQUIRE_REAL_NODE=1 (set by CI), where a missing capability fails. Every address
// it uses is on this machine: the API server's advertise address and the pods are on the
// bridge crdipc0 (10.88.0.0/16), with no route out.
package realnode
