// Package simnode is the node side of the simulated nodes of `crdipc up`, where no kubelet
// runs: it creates the Nodes node-1 … node-N at start if they are missing, reports every
// Node labelled crdipc.io/simulated=true Ready while the process runs (a Node added later
// with kubectl too), and Ready=Unknown when it stops, as a node controller would for a
// kubelet that stopped posting status.
//
// What runs on a simulated node lives elsewhere and keys on the same label: package podsim
// runs its Pods, and the storage supervisor (internal/storage/agent) its pool agent.
//
// The label used to be storage.crdipc.io/simulated, when storage was the only user; a Node
// found carrying it, as in the data directory of an earlier version, is relabelled.
//
// Like a kubelet, it renews each served node's Lease in kube-node-lease every 10 s, which
// the node lifecycle controller of `crdipc up` reads (a node whose Lease lapses turns
// Unknown and is tainted), and reports the node's capacity (this machine's cores and
// memory, 110 pods), which kube-scheduler fits pods against.
//
// Each node writes as itself (Options.Kubelet; in `crdipc up`, system:node:<name>, whose
// certificate up issues from the cluster's CA): it registers its own Node, reports its
// status, relabels it and renews its own Lease, all of which the Node authorizer and
// NodeRestriction admission allow a kubelet for its own node and for no other. A kubelet
// cannot list Nodes, though, and finding the labelled ones is what lets a Node added with
// kubectl join, so the watch runs as the service's own read-only identity (crdipc-nodes,
// config/rbac/nodes):
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
package simnode
