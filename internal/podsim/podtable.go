package podsim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ensure returns the pod's state, creating it (and the pod's directory) the first time
// this runtime sees the pod: at its start, or after a restart of up.
func (r *runtime) ensure(pod *corev1.Pod) (*podState, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ps := r.pods[pod.UID]; ps != nil {
		ps.grace = gracePeriod(pod)
		return ps, nil
	}
	ps := newPodState(pod, r.o.Root, r.known)
	if err := os.MkdirAll(ps.dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating directory of pod %s: %w", ps.key, err)
	}
	r.pods[pod.UID] = ps
	return ps, nil
}

func (r *runtime) known(image string) bool { return r.images[repository(image)] != nil }

// forgetKey forgets every pod state of that name except the one with UID keep: those
// pod objects are gone.
func (r *runtime) forgetKey(key types.NamespacedName, keep types.UID) {
	r.mu.Lock()
	var gone []types.UID
	for uid, ps := range r.pods {
		if ps.key == key && uid != keep {
			gone = append(gone, uid)
		}
	}
	r.mu.Unlock()
	for _, uid := range gone {
		r.forgetUID(uid, true)
	}
}

// forgetUID drops a pod's state and stops its processes in the background (with at
// most 2 s of grace, as kubelet gives a pod removed under it); with removeDir, the
// pod's directory is removed once they are gone.
func (r *runtime) forgetUID(uid types.UID, removeDir bool) {
	dir := filepath.Join(r.o.Root, string(uid))
	r.mu.Lock()
	if r.stopping {
		r.mu.Unlock()
		return // stopAll stops everything; directories stay for the next start
	}
	ps := r.pods[uid]
	var runs []*procRun
	grace := 2 * time.Second
	if ps != nil {
		delete(r.pods, uid)
		ps.finished = true
		r.ips.release(ps.ip, uid)
		runs = ps.liveRuns()
		grace = min(grace, ps.grace)
	}
	if len(runs) == 0 && !removeDir && (ps == nil || !r.needsTeardown(ps)) {
		r.mu.Unlock()
		return
	}
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		stopRuns(runs, grace)
		if ps != nil {
			r.volOps.Lock()
			ctx, cancel := context.WithTimeout(r.volCtx, volumeTimeout)
			err := r.unmountVolumes(ctx, ps)
			cancel()
			r.volOps.Unlock()
			if err != nil {
				r.log.Error(err, "unmounting the volumes of a pod that is gone", "pod", ps.key)
			}
			r.mu.Lock()
			r.releaseHostDirs(uid)
			r.mu.Unlock()
		}
		if removeDir {
			r.removePodDir(dir)
		}
	}()
}

// stopAll stops every process, each pod's within min(its grace period, StopTimeout), and
// waits for every goroutine of the runtime. Pod objects and directories stay: a restarted
// up starts the pods again.
func (r *runtime) stopAll() {
	r.mu.Lock()
	r.stopping = true
	r.volCancel()
	type group struct {
		runs  []*procRun
		grace time.Duration
	}
	var groups []group
	for _, ps := range r.pods {
		if runs := ps.liveRuns(); len(runs) > 0 {
			groups = append(groups, group{runs, min(ps.grace, r.o.StopTimeout)})
		}
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stopRuns(g.runs, g.grace)
		}()
	}
	wg.Wait()
	r.wg.Wait()
	r.unmountAll()
	r.mu.Lock()
	l := r.launch
	r.launch = nil
	r.mu.Unlock()
	if l != nil {
		l.close()
	}
}

// unmountAll unmounts every pod's volumes once every process is gone, so that the volume
// targets close their replicas cleanly; the next start mounts them again. It also removes
// the mount point directories the runtime created.
func (r *runtime) unmountAll() {
	r.mu.Lock()
	pods := make([]*podState, 0, len(r.pods))
	for _, ps := range r.pods {
		pods = append(pods, ps)
	}
	r.mu.Unlock()
	r.volOps.Lock()
	defer r.volOps.Unlock()
	for _, ps := range pods {
		ctx, cancel := context.WithTimeout(context.Background(), volumeTimeout)
		if err := r.unmountVolumes(ctx, ps); err != nil {
			r.log.Error(err, "unmounting volumes at stop", "pod", ps.key)
		}
		cancel()
	}
	r.mu.Lock()
	for _, ps := range pods {
		r.releaseHostDirs(ps.uid)
	}
	r.mu.Unlock()
}

// sweep removes the directories of pods that no longer exist: pods deleted while up was
// not running.
func (r *runtime) sweep(ctx context.Context) {
	entries, err := os.ReadDir(r.o.Root)
	if err != nil {
		r.log.Error(err, "reading pod directories")
		return
	}
	var pods corev1.PodList
	if err := r.reader.List(ctx, &pods); err != nil {
		r.log.Error(err, "listing pods to remove stale pod directories")
		return
	}
	live := make(map[types.UID]bool, len(pods.Items))
	for i := range pods.Items {
		live[pods.Items[i].UID] = true
	}
	for _, e := range entries {
		uid := types.UID(e.Name())
		if !e.IsDir() || !looksLikeUID(e.Name()) || live[uid] {
			continue
		}
		r.mu.Lock()
		if r.pods[uid] == nil {
			r.removePodDir(filepath.Join(r.o.Root, e.Name()))
		}
		r.mu.Unlock()
	}
}

// looksLikeUID: sweep removes only directories named like a pod UID, nothing else under Root.
func looksLikeUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, c := range s {
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
		}
	}
	return true
}
