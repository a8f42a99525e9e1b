package podsim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Pod IPs are 127.2.x.y with y in 1…254: loopback addresses Linux routes to lo
// without configuration, distinct per pod so that every pod can listen on its ports.
const ipCount = 256 * 254

func podIPAt(i int) string { return fmt.Sprintf("127.2.%d.%d", i/254, i%254+1) }

// podIPIndexOf is the index of a pod IP in the range, or -1.
func podIPIndexOf(s string) int {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return -1
	}
	b := a.As4()
	if b[0] != 127 || b[1] != 2 || b[3] == 0 || b[3] == 255 {
		return -1
	}
	return int(b[2])*254 + int(b[3]) - 1
}

// ipAllocator hands out pod IPs; the runtime uses it under mu. It knows the IPs of the
// pods the runtime runs; reported answers for the pods it does not run (yet).
type ipAllocator struct {
	owners map[string]types.UID // IP → the pod this runtime runs with it
	next   int                  // index where the search for a free IP resumes
	// reported says whether a live pod other than uid reports ip in its status: one this
	// runtime has not seen yet since up started, say.
	reported func(ip string, uid types.UID) bool
}

// newIPAllocator starts its search at a random IP: several clusters on one machine (two
// ups, tests running in parallel) share 127.2.0.0/16 without seeing each other's pods, and
// would otherwise all hand out 127.2.0.1 first and collide on its ports.
func newIPAllocator(reported func(ip string, uid types.UID) bool) *ipAllocator {
	return &ipAllocator{owners: map[string]types.UID{}, reported: reported, next: rand.IntN(ipCount)}
}

// assign gives pod uid an IP: want (the one its status reports) when that is free, so that
// a pod keeps its IP across restarts of up, else the next free one.
func (a *ipAllocator) assign(uid types.UID, want string) (string, error) {
	if podIPIndexOf(want) >= 0 && a.free(want, uid) {
		a.owners[want] = uid
		return want, nil
	}
	for n := 0; n < ipCount; n++ {
		i := (a.next + n) % ipCount
		if ip := podIPAt(i); a.free(ip, uid) {
			a.next = i + 1
			a.owners[ip] = uid
			return ip, nil
		}
	}
	return "", fmt.Errorf("no free pod IP in 127.2.0.0/16")
}

// release frees ip if pod uid holds it.
func (a *ipAllocator) release(ip string, uid types.UID) {
	if a.owners[ip] == uid {
		delete(a.owners, ip)
	}
}

// free: no other pod this runtime runs holds ip, and no other live pod reports it.
func (a *ipAllocator) free(ip string, uid types.UID) bool {
	if owner, ok := a.owners[ip]; ok && owner != uid {
		return false
	}
	return !a.reported(ip, uid)
}

// assignIP gives the pod its IP, under mu, unless it has one.
func (r *runtime) assignIP(ps *podState, pod *corev1.Pod) error {
	if ps.ip != "" {
		return nil
	}
	ip, err := r.ips.assign(ps.uid, pod.Status.PodIP)
	if err != nil {
		return err
	}
	ps.ip = ip
	return nil
}

// ipReported is the allocator's reported: whether a live pod other than uid reports ip, as
// the cache sees it. An error counts as reported: the allocator then takes another IP.
func (r *runtime) ipReported(ip string, uid types.UID) bool {
	var pods corev1.PodList
	if err := r.c.List(context.Background(), &pods, client.MatchingFields{podIPIndex: ip}); err != nil {
		return true
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.UID != uid && !terminal(p.Status.Phase) {
			return true
		}
	}
	return false
}
