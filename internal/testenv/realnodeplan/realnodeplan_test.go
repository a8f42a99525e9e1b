package realnodeplan

import (
	"net/netip"
	"testing"
)

// The plan's ranges must nest as the script uses them: every node's address on the link,
// its pods in the cluster range and apart from the link and from each other.
func TestPlanNests(t *testing.T) {
	cluster := netip.MustParsePrefix(ClusterCIDR)
	link := netip.PrefixFrom(netip.MustParseAddr(HostIP), LinkPrefix).Masked()
	if !cluster.Contains(link.Addr()) || link.Bits() < cluster.Bits() {
		t.Fatalf("link %s not inside cluster %s", link, cluster)
	}
	if netip.MustParsePrefix(ServiceCIDR).Overlaps(cluster) {
		t.Fatalf("service range %s overlaps cluster %s", ServiceCIDR, cluster)
	}
	seen := map[netip.Prefix]int{}
	for i := 1; i <= MaxIndex; i++ {
		n := NodeN(i)
		ip := netip.MustParseAddr(n.IP())
		if !link.Contains(ip) || ip == netip.MustParseAddr(HostIP) || ip == link.Addr() {
			t.Fatalf("node %d: address %s not a host address of %s", i, ip, link)
		}
		pods := netip.MustParsePrefix(n.PodCIDR())
		if !cluster.Contains(pods.Addr()) || pods.Overlaps(link) {
			t.Fatalf("node %d: pods %s outside %s or on the link %s", i, pods, cluster, link)
		}
		if j, ok := seen[pods]; ok {
			t.Fatalf("nodes %d and %d share pods %s", j, i, pods)
		}
		seen[pods] = i
	}
}
