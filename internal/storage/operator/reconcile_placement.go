package operator

import (
	"fmt"
	"slices"
	"strings"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// choosePools picks up to need pools for new replicas of a volume of the given capacity
// that already has replicas have. Only Healthy pools that are not being deleted, hold no
// replica of the volume and have room qualify. Each pick prefers a node the volume does not
// use yet, then the pool with the smallest used fraction, then the name, so the result
// is deterministic. used maps pool name to the capacity its replicas take, and is updated
// with the picks.
func choosePools(pools []storagev1alpha1.CStorPool, have []storagev1alpha1.CStorVolumeReplica, used map[string]int64, capacity int64, need int) []*storagev1alpha1.CStorPool {
	onPool, onNode := map[string]bool{}, map[string]bool{}
	for _, r := range have {
		onPool[r.Spec.Pool] = true
		onNode[r.Spec.NodeName] = true
	}
	var candidates []*storagev1alpha1.CStorPool
	for i := range pools {
		p := &pools[i]
		if p.Status.Phase == storagev1alpha1.PoolPhaseHealthy && p.DeletionTimestamp.IsZero() && !onPool[p.Name] &&
			p.Spec.Capacity.Value()-used[p.Name] >= capacity {
			candidates = append(candidates, p)
		}
	}
	var picked []*storagev1alpha1.CStorPool
	for len(picked) < need && len(candidates) > 0 {
		best := slices.MinFunc(candidates, func(a, b *storagev1alpha1.CStorPool) int {
			if onNode[a.Spec.NodeName] != onNode[b.Spec.NodeName] {
				if onNode[a.Spec.NodeName] {
					return 1
				}
				return -1
			}
			// The least used fraction of its capacity first.
			fa := float64(used[a.Name]) / float64(max(a.Spec.Capacity.Value(), 1))
			fb := float64(used[b.Name]) / float64(max(b.Spec.Capacity.Value(), 1))
			if fa != fb {
				if fa < fb {
					return -1
				}
				return 1
			}
			return strings.Compare(a.Name, b.Name)
		})
		picked = append(picked, best)
		onNode[best.Spec.NodeName] = true
		used[best.Name] += capacity
		candidates = slices.DeleteFunc(candidates, func(p *storagev1alpha1.CStorPool) bool { return p == best })
	}
	return picked
}

// shortfall says why the Healthy pools that hold no replica of a volume take none of
// capacity: they are too small or too full. "" when no such pool is refused for its space,
// so that "waiting for 1 more pool" never hides that three pools exist but none can hold
// the volume.
func shortfall(pools []storagev1alpha1.CStorPool, have []storagev1alpha1.CStorVolumeReplica, used map[string]int64, capacity int64) string {
	onPool := map[string]bool{}
	for _, r := range have {
		onPool[r.Spec.Pool] = true
	}
	n, mostFree := 0, int64(0)
	for i := range pools {
		p := &pools[i]
		if p.Status.Phase != storagev1alpha1.PoolPhaseHealthy || !p.DeletionTimestamp.IsZero() || onPool[p.Name] {
			continue
		}
		free := p.Spec.Capacity.Value() - used[p.Name]
		if free >= capacity {
			continue
		}
		n++
		mostFree = max(mostFree, free)
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("%d healthy %s without a replica of this volume cannot hold %s (the most free space left is %s)",
		n, plural(n, "pool"), resource.NewQuantity(capacity, resource.BinarySI), resource.NewQuantity(max(mostFree, 0), resource.BinarySI))
}
