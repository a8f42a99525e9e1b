package operator

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
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
			poolFree(p, used) >= capacity {
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
			fa := float64(used[a.Name]) / float64(max(poolBytes(a), 1))
			fb := float64(used[b.Name]) / float64(max(poolBytes(b), 1))
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
		used[best.Name] = addBytes(used[best.Name], capacity)
		candidates = slices.DeleteFunc(candidates, func(p *storagev1alpha1.CStorPool) bool { return p == best })
	}
	return picked
}

// poolBytes is a pool's configured capacity in bytes. The CRD keeps it within an int64; a
// value beyond (written around the validation) counts as 0, a pool that takes nothing,
// rather than as whatever Quantity.Value makes of it.
func poolBytes(p *storagev1alpha1.CStorPool) int64 {
	n, err := storagev1alpha1.Bytes(p.Spec.Capacity)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// poolFree is what is left of a pool's capacity once its replicas take theirs; negative
// when overcommitted. Both terms are non-negative, so the difference cannot overflow.
func poolFree(p *storagev1alpha1.CStorPool, used map[string]int64) int64 {
	return poolBytes(p) - used[p.Name]
}

// addBytes adds two non-negative byte counts, saturating at the largest int64: a pool whose
// replicas add up to more than that is full, never (as a wrapped-around sum would say)
// empty.
func addBytes(a, b int64) int64 {
	if b > math.MaxInt64-a {
		return math.MaxInt64
	}
	return a + b
}

func quantity(n int64) *resource.Quantity { return resource.NewQuantity(n, resource.BinarySI) }

// neverFits says why no pool could ever hold a replica of a volume of capacity bytes, or ""
// when one could. A pool's capacity is fixed when it is made, so it could when an existing
// pool (not being deleted, in whatever phase: an Offline one may come back) is at least
// that large in total, or when a claim makes pools that large for the nodes that join.
// Free space does not count: replicas come and go. With neither pools nor claims yet,
// nothing is known and nothing is refused.
func neverFits(pools []storagev1alpha1.CStorPool, claims []storagev1alpha1.StoragePoolClaim, capacity int64) string {
	var (
		npools, nclaims        int
		largestPool, claimPool int64
	)
	for i := range pools {
		p := &pools[i]
		if !p.DeletionTimestamp.IsZero() {
			continue
		}
		npools++
		largestPool = max(largestPool, poolBytes(p))
	}
	for i := range claims {
		c := &claims[i]
		if !c.DeletionTimestamp.IsZero() {
			continue
		}
		nclaims++
		if n, err := storagev1alpha1.Bytes(c.Spec.Capacity); err == nil {
			claimPool = max(claimPool, n)
		}
	}
	if npools+nclaims == 0 || largestPool >= capacity || claimPool >= capacity {
		return ""
	}
	var why []string
	if npools > 0 {
		why = append(why, fmt.Sprintf("the largest of %d %s holds %s", npools, plural(npools, "pool"), quantity(largestPool)))
	} else {
		why = append(why, "there is no pool yet")
	}
	if nclaims > 0 {
		claimsMake := "the storage pool claim makes"
		if nclaims > 1 {
			claimsMake = fmt.Sprintf("the %d storage pool claims make", nclaims)
		}
		why = append(why, fmt.Sprintf("%s pools of at most %s", claimsMake, quantity(claimPool)))
	}
	return fmt.Sprintf("no pool could ever hold a replica of %s: %s; a larger volume needs a StoragePoolClaim with a larger capacity",
		quantity(capacity), strings.Join(why, ", and "))
}

// shortfall says why the pools that hold no replica of a volume take none of capacity:
// some are too small for it for good, some large enough ones are too full now. "" when no
// pool is refused for its space, so that "waiting for 1 more pool" means exactly that the
// volume needs another pool, and never hides that pools exist but cannot hold it.
func shortfall(pools []storagev1alpha1.CStorPool, have []storagev1alpha1.CStorVolumeReplica, used map[string]int64, capacity int64) string {
	onPool := map[string]bool{}
	for _, r := range have {
		onPool[r.Spec.Pool] = true
	}
	var (
		small, full       int
		largest, mostFree int64
	)
	for i := range pools {
		p := &pools[i]
		if !p.DeletionTimestamp.IsZero() || onPool[p.Name] {
			continue
		}
		switch total := poolBytes(p); {
		case total < capacity:
			small++
			largest = max(largest, total)
		case p.Status.Phase != storagev1alpha1.PoolPhaseHealthy:
			// Large enough; it is its phase that keeps it out, and the placed/waiting
			// counts say so.
		case poolFree(p, used) < capacity:
			full++
			mostFree = max(mostFree, poolFree(p, used))
		}
	}
	var why []string
	if full > 0 {
		why = append(why, fmt.Sprintf("no pool has %s free (%d healthy %s large enough without a replica of this volume %s too full: the most free space left is %s)",
			quantity(capacity), full, plural(full, "pool"), isAre(full), quantity(mostFree)))
	}
	if small > 0 {
		why = append(why, fmt.Sprintf("%d %s without a replica of this volume %s smaller than %s (the largest holds %s)",
			small, plural(small, "pool"), isAre(small), quantity(capacity), quantity(largest)))
	}
	return strings.Join(why, "; ")
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}
