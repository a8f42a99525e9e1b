package podsim

import (
	"context"
	"fmt"
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

// assignIP gives the pod its IP, under mu: the one its status reports when that is free
// (a pod keeps its IP across restarts of up), else the next free one.
func (r *runtime) assignIP(ps *podState, pod *corev1.Pod) error {
	if ps.ip != "" {
		return nil
	}
	if want := pod.Status.PodIP; podIPIndexOf(want) >= 0 && r.ipFree(want, ps.uid) {
		r.ips[want], ps.ip = ps.uid, want
		return nil
	}
	for n := 0; n < ipCount; n++ {
		i := (r.nextIP + n) % ipCount
		if ip := podIPAt(i); r.ipFree(ip, ps.uid) {
			r.nextIP = i + 1
			r.ips[ip], ps.ip = ps.uid, ip
			return nil
		}
	}
	return fmt.Errorf("no free pod IP in 127.2.0.0/16")
}

// ipFree: no other pod this runtime runs holds ip, and no other live pod reports it
// (one this runtime has not seen yet since up started, say).
func (r *runtime) ipFree(ip string, uid types.UID) bool {
	if owner, ok := r.ips[ip]; ok && owner != uid {
		return false
	}
	var pods corev1.PodList
	if err := r.c.List(context.Background(), &pods, client.MatchingFields{podIPIndex: ip}); err != nil {
		return false
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.UID != uid && !terminal(p.Status.Phase) {
			return false
		}
	}
	return true
}
