package realnode

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/bitcoin/btcd"
)

// btcNetwork is the BitcoinNetwork of testBitcoin, in the default namespace.
const btcNetwork = "btcd"

// testBitcoin: a BitcoinNetwork of btcd nodes (the image join imports; nothing simulated)
// runs on the real nodes, spread over them, and the operator of config/default links its
// peers, as the nodes themselves report over their RPC, asked from the host through the
// pod IPs: three nodes link up, link again when a pod is killed, and stay linked scaled to
// five and down to two.
func (c *cluster) testBitcoin(t *testing.T) {
	c.apply(t, `apiVersion: bitcoin.crdipc.io/v1alpha1
kind: BitcoinNetwork
metadata: {name: `+btcNetwork+`, namespace: default}
spec: {nodes: 3, network: regtest, implementation: btcd}
`)
	t.Cleanup(func() {
		c.kubectl(t, "delete", "bitcoinnetwork", btcNetwork, "--wait=true")
		// The next subtests lose nodes: no node pod may be left to stall them.
		c.poll(t, 2*time.Minute, "the network's pods gone", func() (bool, string) {
			left := c.kubectl(t, "get", "pods", "-l", "bitcoin.crdipc.io/network="+btcNetwork, "-o", "name")
			return strings.TrimSpace(left) == "", left
		})
	})
	pods := c.btcReady(t, 3)
	nodes := map[string]bool{}
	for _, p := range pods {
		nodes[p.node] = true
	}
	if len(nodes) != 3 {
		t.Errorf("3 btcd pods on nodes %v, want one on each real node", pods)
	}
	c.btcLinked(t, pods)

	// Killed, a pod comes back as a new btcd knowing no peer: linked again only through
	// the operator.
	victim := pods[1]
	c.kubectl(t, "delete", "pod", victim.name, "--grace-period=1", "--wait=true")
	c.poll(t, 3*time.Minute, victim.name+" replaced", func() (bool, string) {
		uid := c.kubectl(t, "get", "pod", victim.name, "--ignore-not-found", "-o", "jsonpath={.metadata.uid}")
		return uid != "" && uid != victim.uid, "uid " + uid
	})
	pods = c.btcReady(t, 3)
	c.btcLinked(t, pods)

	c.kubectl(t, "patch", "bitcoinnetwork", btcNetwork, "--type=merge", "-p", `{"spec":{"nodes":5}}`)
	c.btcLinked(t, c.btcReady(t, 5))
	c.kubectl(t, "patch", "bitcoinnetwork", btcNetwork, "--type=merge", "-p", `{"spec":{"nodes":2}}`)
	c.btcLinked(t, c.btcReady(t, 2))
}

// btcPod is one node pod of the network.
type btcPod struct{ name, uid, node, ip string }

func (p btcPod) String() string { return p.name + "@" + p.node + "/" + p.ip }

// btcReady waits until the network is Ready for its current generation with n nodes, every
// one of its pods running on a real node with its IP in the status, and returns the pods.
func (c *cluster) btcReady(t *testing.T, n int) []btcPod {
	t.Helper()
	var pods []btcPod
	c.poll(t, 5*time.Minute, fmt.Sprintf("network %s Ready with %d nodes", btcNetwork, n), func() (bool, string) {
		status := c.kubectl(t, "get", "bitcoinnetwork", btcNetwork, "-o",
			`jsonpath={.metadata.generation} {.status.observedGeneration} {.status.conditions[?(@.type=="Ready")].status} {.status.readyNodes} {.status.peers} {.status.nodes[*].ip}`)
		f := strings.Fields(status)
		if len(f) < 5 || f[0] != f[1] || f[2] != "True" || f[3] != fmt.Sprint(n) || f[4] != fmt.Sprint(n*(n-1)/2) {
			return false, "generation, observed, Ready, readyNodes, peers, IPs: " + status
		}
		inStatus := map[string]bool{}
		for _, ip := range f[5:] {
			inStatus[ip] = true
		}
		out := c.kubectl(t, "get", "pods", "-l", "bitcoin.crdipc.io/network="+btcNetwork, "-o",
			`jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.spec.nodeName} {.status.podIP} {.metadata.deletionTimestamp}{"\n"}{end}`)
		pods = nil
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			if len(f) != 4 { // no IP yet, or being deleted
				return false, "pods: " + out
			}
			p := btcPod{name: f[0], uid: f[1], node: f[2], ip: f[3]}
			if !strings.HasPrefix(p.node, "real-") || !inStatus[p.ip] {
				return false, fmt.Sprintf("pod %s: not on a real node or not in the status (%s)", p, status)
			}
			pods = append(pods, p)
		}
		return len(pods) == n, "pods: " + out
	})
	sort.Slice(pods, func(i, j int) bool { return pods[i].name < pods[j].name })
	return pods
}

// btcLinked waits until, as the nodes report over RPC (getpeerinfo), every pair of pods is
// linked in one direction at least.
func (c *cluster) btcLinked(t *testing.T, pods []btcPod) {
	t.Helper()
	secret := func(key string) string {
		v, err := base64.StdEncoding.DecodeString(c.kubectl(t, "get", "secret", btcNetwork+"-rpc", "-o", "jsonpath={.data."+key+"}"))
		if err != nil {
			t.Fatalf("secret %s-rpc key %s: %v", btcNetwork, key, err)
		}
		return string(v)
	}
	user, pass := secret("user"), secret("password")
	port := c.kubectl(t, "get", "service", btcNetwork, "-o", `jsonpath={.spec.ports[?(@.name=="rpc")].port}`)
	c.poll(t, time.Minute, fmt.Sprintf("%d pods linked pairwise, as their getpeerinfo says", len(pods)), func() (bool, string) {
		seen := map[string]map[string]bool{}
		for _, p := range pods {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			peers, err := btcd.PeerHosts(ctx, net.JoinHostPort(p.ip, port), user, pass)
			cancel()
			if err != nil {
				return false, err.Error()
			}
			seen[p.ip] = peers
		}
		for i, a := range pods {
			for _, b := range pods[i+1:] {
				if !seen[a.ip][b.ip] && !seen[b.ip][a.ip] {
					return false, fmt.Sprintf("%s and %s not linked; peers by node: %v", a, b, seen)
				}
			}
		}
		return true, ""
	})
}
