package realnodeplan

import (
	"fmt"
	"strconv"
)

const (
	// Bridge is the host's link to every node (each node's veth is a port of it).
	Bridge = "crdipc0"
	// HostIP is the host's address on Bridge, where up's API server serves the nodes.
	HostIP = "10.88.0.1"
	// LinkPrefix is the prefix length of Bridge's subnet, 10.88.0.0/24: the host and the
	// nodes; the nodes' pod ranges are the other /24s of ClusterCIDR.
	LinkPrefix = 24
	// ClusterCIDR holds the link and every node's pods: routed between nodes through the
	// host, never masqueraded.
	ClusterCIDR = "10.88.0.0/16"
	// ServiceCIDR is the range routed to a node's kube-proxy; it covers up's 10.96.0.0/24.
	ServiceCIDR = "10.96.0.0/12"
	// MaxIndex is the highest node index: 10+N must stay a host address of the link.
	MaxIndex = 200
)

// Node is the node with index N (1-MaxIndex).
type Node struct{ Index int }

// NodeN is node i.
func NodeN(i int) Node { return Node{Index: i} }

// Name is the node's Kubernetes name.
func (n Node) Name() string { return fmt.Sprintf("real-%d", n.Index) }

// Dir is the node's work directory: short, for the Unix socket paths under it.
func (n Node) Dir() string { return fmt.Sprintf("/tmp/crdipc-rn%d", n.Index) }

// IP is the node's address on Bridge.
func (n Node) IP() string { return fmt.Sprintf("10.88.0.%d", 10+n.Index) }

// PodCIDR is the node's pod range.
func (n Node) PodCIDR() string { return fmt.Sprintf("10.88.%d.0/24", n.Index) }

// NetworkFlags are `hack/realnode.sh network`'s flags.
func NetworkFlags() []string {
	return []string{
		"--bridge", Bridge,
		"--host-address", HostIP + "/" + strconv.Itoa(LinkPrefix),
		"--cluster-cidr", ClusterCIDR,
		"--service-cidr", ServiceCIDR,
	}
}

// AddressFlags are the node's addresses as `hack/realnode.sh join` takes them (the network's
// included).
func (n Node) AddressFlags() []string {
	return append(NetworkFlags(),
		"--node-address", n.IP()+"/"+strconv.Itoa(LinkPrefix),
		"--pod-cidr", n.PodCIDR(),
	)
}

// JoinFlags are `hack/realnode.sh join`'s flags for the node, but its credentials and images.
func (n Node) JoinFlags() []string {
	return append([]string{"--dir", n.Dir(), "--node", n.Name(), "--index", strconv.Itoa(n.Index)},
		n.AddressFlags()...)
}
