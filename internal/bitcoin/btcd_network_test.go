package bitcoin_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bitcoinv1alpha1 "github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
	"github.com/crdipc/crdipc/internal/bitcoin"
	"github.com/crdipc/crdipc/internal/bitcoin/btcd"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/ipc"
)

// A btcd network runs the btcd image with btcd's own flags (on the simulated nodes, the
// host's btcd with the pod's command line), comes up with every node linked to the
// others — checked on the nodes over their TLS RPC, not through the operator — and links
// again after one of its pods is deleted.
func TestBtcdNetworkConnectsAndRelinks(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	n := &bitcoinv1alpha1.BitcoinNetwork{}
	n.Namespace, n.Name = w.ns, "btcd"
	n.Spec = bitcoinv1alpha1.BitcoinNetworkSpec{Nodes: 3, Implementation: bitcoinv1alpha1.ImplementationBtcd}
	cctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := ipc.Call(cctx, w.env.Client, n, ipc.Ready); err != nil {
		t.Fatalf("btcd network of 3: %v (status %+v)", err, n.Status)
	}
	if n.Spec.Image != "" {
		t.Errorf("spec.image = %q: the operator must not write the default into the spec", n.Spec.Image)
	}
	var pods corev1.PodList
	if err := w.env.Client.List(ctx, &pods, client.InNamespace(w.ns), client.MatchingLabels{bitcoin.NetworkLabel: n.Name}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if c := p.Spec.Containers[0]; c.Image != bitcoinv1alpha1.BtcdImage || c.Command[0] != "btcd" {
			t.Errorf("pod %s runs %s %v, want %s btcd …", p.Name, c.Image, c.Command, bitcoinv1alpha1.BtcdImage)
		}
	}
	w.linkedOverTLS(t, n, 3)

	// A deleted pod comes back as a new btcd with an empty address book: only the
	// operator can introduce it again.
	victim, oldUID := pods.Items[0].Name, pods.Items[0].UID
	if err := w.env.Client.Delete(ctx, &pods.Items[0]); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 90*time.Second, victim+" replaced and the network Ready again", func(ctx context.Context) (bool, error) {
		var p corev1.Pod
		if err := w.env.Client.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: victim}, &p); err != nil {
			return false, err
		}
		if p.UID == oldUID {
			return false, fmt.Errorf("%s not replaced yet", victim)
		}
		if err := w.env.Client.Get(ctx, client.ObjectKeyFromObject(n), n); err != nil {
			return false, err
		}
		// Ready for a status computed after the new pod was ready: the node lists it.
		for _, nd := range n.Status.Nodes {
			if nd.Name == victim && nd.IP == p.Status.PodIP && nd.Ready && n.Status.Peers == 3 {
				return true, nil
			}
		}
		return false, fmt.Errorf("status %+v", n.Status)
	})
	w.linkedOverTLS(t, n, 3)
}

// linkedOverTLS waits until every node of n, asked over btcd's TLS RPC, is connected to
// the other nodes' IPs (one direction suffices per pair, as the operator counts).
func (w *world) linkedOverTLS(t *testing.T, n *bitcoinv1alpha1.BitcoinNetwork, nodes int) {
	t.Helper()
	var s corev1.Secret
	if err := w.env.Client.Get(context.Background(), client.ObjectKey{Namespace: n.Namespace, Name: bitcoin.SecretName(n)}, &s); err != nil {
		t.Fatal(err)
	}
	user, pass := string(s.Data[bitcoin.SecretUser]), string(s.Data[bitcoin.SecretPassword])
	port := bitcoin.PortsOf(bitcoinv1alpha1.ImplementationBtcd, n.Spec.Network).RPC
	testenv.Eventually(t, 30*time.Second, "every pair linked, as the nodes see it", func(ctx context.Context) (bool, error) {
		if len(n.Status.Nodes) != nodes {
			return false, fmt.Errorf("status lists %d nodes", len(n.Status.Nodes))
		}
		seen := map[string]map[string]bool{}
		for _, nd := range n.Status.Nodes {
			hosts, err := btcd.PeerHosts(ctx, net.JoinHostPort(nd.IP, strconv.Itoa(int(port))), user, pass)
			if err != nil {
				return false, err
			}
			seen[nd.IP] = hosts
		}
		for i, a := range n.Status.Nodes {
			for _, b := range n.Status.Nodes[i+1:] {
				if !seen[a.IP][b.IP] && !seen[b.IP][a.IP] {
					return false, fmt.Errorf("%s and %s not linked: %v", a.Name, b.Name, seen)
				}
			}
		}
		return true, nil
	})
}
