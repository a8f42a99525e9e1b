package bitcoin

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bitcoinv1alpha1 "github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
	"github.com/crdipc/crdipc/api/conditions"
	"github.com/crdipc/crdipc/ipc"
)

// node is one pod of the network as this reconcile sees it.
type node struct {
	pod   *corev1.Pod
	ip    string
	ready bool            // the pod is Ready and its RPC answered
	peers map[string]bool // IPs it is connected to
	why   string          // why it is not ready, for the status message
}

// connect reads every node's peers, asks each ready node to add the ready nodes it is not
// linked to, and reports nodes, readyNodes, peers and Ready.
func (h *handler) connect(ctx context.Context, n *bitcoinv1alpha1.BitcoinNetwork, rpc *rpcClient) (ipc.Result, error) {
	var pods corev1.PodList
	if err := h.c.List(ctx, &pods, client.InNamespace(n.Namespace), client.MatchingLabels{NetworkLabel: n.Name}); err != nil {
		return ipc.Result{}, fmt.Errorf("listing pods: %w", err)
	}
	ports := PortsOf(implementation(n), n.Spec.Network)
	nodes := make([]*node, 0, len(pods.Items))
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp.IsZero() {
			nodes = append(nodes, &node{pod: p, ip: p.Status.PodIP})
		}
	}
	slices.SortFunc(nodes, func(a, b *node) int { return strings.Compare(a.pod.Name, b.pod.Name) })

	// Ask every ready pod for its peers at once: one RPC round trip for the network.
	var wg sync.WaitGroup
	for _, nd := range nodes {
		if nd.why = podProblem(nd.pod); nd.why != "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			peers, err := rpc.peerHosts(ctx, nd.ip, ports.RPC)
			if err != nil {
				nd.why = err.Error()
				return
			}
			nd.ready, nd.peers = true, peers
		}()
	}
	wg.Wait()

	var ready []*node
	for _, nd := range nodes {
		if nd.ready {
			ready = append(ready, nd)
		}
	}
	links, added := 0, 0
	var addErr error
	for i, a := range ready {
		for _, b := range ready[i+1:] {
			if a.peers[b.ip] || b.peers[a.ip] {
				links++
				continue
			}
			// The lower-named node dials: one connection per pair, not two.
			if err := rpc.addNode(ctx, a.ip, ports.RPC, net.JoinHostPort(b.ip, strconv.Itoa(int(ports.P2P)))); err != nil && addErr == nil {
				addErr = err
			}
			added++
		}
	}

	n.Status.Nodes = make([]bitcoinv1alpha1.BitcoinNodeStatus, 0, len(nodes))
	for _, nd := range nodes {
		n.Status.Nodes = append(n.Status.Nodes, bitcoinv1alpha1.BitcoinNodeStatus{Name: nd.pod.Name, IP: nd.ip, Ready: nd.ready})
	}
	n.Status.ReadyNodes = int32(len(ready))
	n.Status.Peers = int32(links)
	want := int(n.Spec.Nodes)
	wantLinks := want * (want - 1) / 2
	msg := fmt.Sprintf("%d of %d nodes ready, %d of %d peer links", len(ready), want, links, wantLinks)
	if len(ready) == want && len(nodes) == want && links == wantLinks {
		res := ipc.Done(msg)
		res.RequeueAfter = h.o.Resync
		return res, nil
	}
	for _, nd := range nodes {
		if nd.why != "" {
			msg += fmt.Sprintf("; %s: %s", nd.pod.Name, nd.why)
			break
		}
	}
	if added > 0 {
		msg += fmt.Sprintf("; connecting %d pair(s)", added)
	}
	if addErr != nil {
		msg += "; " + addErr.Error()
	}
	// Pod changes wake the network up; new connections do not, hence the short requeue.
	return ipc.Waiting(conditions.ReasonWaiting, msg, time.Second), nil
}

// podProblem says why a pod cannot take part yet, or "" when it can be asked over RPC.
func podProblem(p *corev1.Pod) string {
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" {
			return strings.TrimSuffix(w.Reason+": "+w.Message, ": ")
		}
	}
	if p.Status.PodIP == "" {
		if c := podCondition(p, corev1.PodScheduled); c != nil && c.Status == corev1.ConditionFalse {
			return "not scheduled: " + c.Message
		}
		return "no IP yet (" + string(p.Status.Phase) + ")"
	}
	if c := podCondition(p, corev1.PodReady); c == nil || c.Status != corev1.ConditionTrue {
		return "not ready"
	}
	return ""
}

func podCondition(p *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}
