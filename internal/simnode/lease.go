package simnode

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// A kubelet renews its node's Lease in kube-node-lease every 10 s for 40 s; the node
// lifecycle controller turns a node whose Lease is not renewed within its grace period
// (50 s) Unknown and taints it. A simulated node heartbeats the same way while the process
// serving it runs, so the controller treats it as any node.
const (
	leaseNamespace = corev1.NamespaceNodeLease
	leaseDuration  = 40 * time.Second
	renewInterval  = 10 * time.Second
)

// heartbeat renews the Lease of every served node every renewInterval until ctx ends.
func (n *nodes) heartbeat(ctx context.Context) {
	t := time.NewTicker(renewInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.mu.Lock()
		served := make([]string, 0, len(n.served))
		for name := range n.served {
			served = append(served, name)
		}
		n.mu.Unlock()
		for _, name := range served {
			var node corev1.Node
			if err := n.c.Get(ctx, client.ObjectKey{Name: name}, &node); err != nil {
				continue // deleted meanwhile: its reconcile forgets it
			}
			if err := n.renew(ctx, &node); err != nil && ctx.Err() == nil {
				n.log.Error(err, "renewing node lease", "node", name)
			}
		}
	}
}

// renew creates or renews node's Lease, owned by the Node as a kubelet's is, so that it
// goes with it. The node does it itself: a node may only touch its own Lease.
func (n *nodes) renew(ctx context.Context, node *corev1.Node) error {
	c, err := n.o.Kubelet(node.Name)
	if err != nil {
		return fmt.Errorf("renewing lease of node %s: %w", node.Name, err)
	}
	now := metav1.NewMicroTime(time.Now())
	var lease coordinationv1.Lease
	err = c.Get(ctx, client.ObjectKey{Namespace: leaseNamespace, Name: node.Name}, &lease)
	if apierrors.IsNotFound(err) {
		lease = coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: leaseNamespace, Name: node.Name, OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
			}}},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(node.Name),
				LeaseDurationSeconds: ptr.To(int32(leaseDuration / time.Second)),
				RenewTime:            &now,
			},
		}
		if err := c.Create(ctx, &lease); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating lease of node %s: %w", node.Name, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading lease of node %s: %w", node.Name, err)
	}
	if r := lease.Spec.RenewTime; r != nil && time.Since(r.Time) < renewInterval/2 {
		return nil // renewed moments ago (a reconcile right after a heartbeat)
	}
	lease.Spec.HolderIdentity = ptr.To(node.Name)
	lease.Spec.LeaseDurationSeconds = ptr.To(int32(leaseDuration / time.Second))
	lease.Spec.RenewTime = &now
	if err := c.Update(ctx, &lease); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		return fmt.Errorf("renewing lease of node %s: %w", node.Name, err)
	}
	return nil
}

// maxPods is a kubelet's default pod limit.
const maxPods = 110

// capacity is a simulated node's capacity: the cores and memory of this machine, which
// every simulated node's pods share as processes, and a kubelet's default pod limit. Read
// once: every reconcile compares against it.
var capacity = sync.OnceValue(func() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(memTotal(), resource.BinarySI),
		corev1.ResourcePods:   *resource.NewQuantity(maxPods, resource.DecimalSI),
	}
})

// hasCapacity reports whether node already reports the capacity a simulated node should.
func hasCapacity(node *corev1.Node) bool {
	for name, want := range capacity() {
		if got, ok := node.Status.Allocatable[name]; !ok || got.Cmp(want) != 0 {
			return false
		}
	}
	return true
}

// memTotal is this machine's memory in bytes (/proc/meminfo's MemTotal), 8 GiB where that
// cannot be read.
func memTotal() int64 {
	const fallback = 8 << 30
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return fallback
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return fallback
			}
			return kb << 10
		}
	}
	return fallback
}
