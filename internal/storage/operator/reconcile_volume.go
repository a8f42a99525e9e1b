package operator

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/ipc"
)

// volumeHandler places a CStorVolume's replicas and reports their state.
//
// Placing must see every replica that exists: a cache a few milliseconds behind would
// make it place one too many. Replicas this operator created itself are remembered until
// its cache shows them (expectations, as the ReplicaSet controller does). Replicas an
// earlier operator may have created are in the cache once it has synced, except for a
// write racing the leader hand-over; for volumes that existed before this operator
// started, it therefore lists replicas from the API server (a consistent read costs tens of
// milliseconds, which every new volume would otherwise pay).
type volumeHandler struct {
	c    client.Client
	live client.Reader
	log  logr.Logger
	// replaceAfter: see replaceLost.
	replaceAfter time.Duration

	mu        sync.Mutex
	startedAt time.Time
	expected  map[types.UID]map[string]expectedReplica
	// uncertain volumes had a replica create fail in a way that may have happened anyway
	// (a timeout): their next placement reads from the API server.
	uncertain map[types.UID]bool
	// placedAt is when this operator completed a new volume's placement, until the volume
	// is Ready or its hold has passed: see holdFor.
	placedAt map[types.UID]time.Time
	// recentSettle averages how long recent new volumes took from placement to settled.
	recentSettle time.Duration
	// usage adds up the cached replicas' capacity per pool (poolUsage); nil: none.
	usage *usageTracker
}

// settleTime is the shortest hold of a new volume's first status once its replicas are
// placed, maxSettleTime the longest: a volume whose agents report in time goes from no
// status to Ready in one write; one whose agents are slower shows "waiting for their node
// agents" once the hold is over.
//
// The hold follows the agents: twice what new volumes recently took to settle
// (settleWindowLocked). Under a burst of new volumes the agents work through a backlog; a
// fixed second expired there and cost each volume a progress status and an Event on its
// way to Ready. Agents that do not answer at all show after at most maxSettleTime.
const (
	settleTime    = time.Second
	maxSettleTime = 5 * time.Second
)

// placed records that this operator has just completed vol's first placement.
func (h *volumeHandler) placed(uid types.UID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.placedAt == nil {
		h.placedAt = map[types.UID]time.Time{}
	}
	h.placedAt[uid] = time.Now()
}

// holdFor returns how much longer a volume placed a moment ago holds back its first
// status, or 0.
func (h *volumeHandler) holdFor(uid types.UID) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.placedAt[uid]
	if !ok {
		return 0
	}
	left := h.settleWindowLocked() - time.Since(at)
	if left <= 0 {
		delete(h.placedAt, uid)
		return 0
	}
	return left
}

// settleWindowLocked is how long a new volume's first status is held back.
func (h *volumeHandler) settleWindowLocked() time.Duration {
	return min(max(settleTime, 2*h.recentSettle), maxSettleTime)
}

// settled ends a volume's hold: it is Ready, or something is wrong and is reported at once.
func (h *volumeHandler) settled(uid types.UID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if at, ok := h.placedAt[uid]; ok {
		// A moving average over the last few volumes: it rises with a backlog and falls
		// back within a few volumes once the agents keep up.
		h.recentSettle += (time.Since(at) - h.recentSettle) / 4
		delete(h.placedAt, uid)
	}
}

type expectedReplica struct {
	replica storagev1alpha1.CStorVolumeReplica
	at      time.Time
}

// expectationTTL bounds how long a created replica that never shows up in the cache (it
// was deleted at once) is counted.
const expectationTTL = 30 * time.Second

// Start implements manager.Runnable: it marks when this operator began to act (as the
// leader, when leader election is on).
func (h *volumeHandler) Start(ctx context.Context) error {
	h.mu.Lock()
	h.startedAt = time.Now()
	h.mu.Unlock()
	<-ctx.Done()
	return nil
}

// needLiveRead reports whether the cache plus expectations may not show all of vol's
// replicas: vol may have been served by an earlier operator, or a create's outcome is
// unknown. It clears the latter.
func (h *volumeHandler) needLiveRead(vol *storagev1alpha1.CStorVolume) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.uncertain[vol.UID] {
		delete(h.uncertain, vol.UID)
		return true
	}
	// creationTimestamp has whole seconds: a second of margin.
	return h.startedAt.IsZero() || !vol.CreationTimestamp.Time.After(h.startedAt.Add(time.Second))
}

func (h *volumeHandler) markUncertain(uid types.UID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.uncertain == nil {
		h.uncertain = map[types.UID]bool{}
	}
	h.uncertain[uid] = true
}

// withExpected adds to the cached replicas those this operator created that the cache
// does not show yet, and forgets those it shows.
func (h *volumeHandler) withExpected(uid types.UID, cached []storagev1alpha1.CStorVolumeReplica) []storagev1alpha1.CStorVolumeReplica {
	h.mu.Lock()
	defer h.mu.Unlock()
	exp := h.expected[uid]
	for _, r := range cached {
		delete(exp, r.Name)
	}
	for name, e := range exp {
		if time.Since(e.at) > expectationTTL {
			delete(exp, name)
			continue
		}
		cached = append(cached, e.replica)
	}
	if len(exp) == 0 {
		delete(h.expected, uid)
	}
	return cached
}

func (h *volumeHandler) expect(uid types.UID, r *storagev1alpha1.CStorVolumeReplica) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.expected == nil {
		h.expected = map[types.UID]map[string]expectedReplica{}
	}
	if h.expected[uid] == nil {
		h.expected[uid] = map[string]expectedReplica{}
	}
	h.expected[uid][r.Name] = expectedReplica{replica: *r, at: time.Now()}
}

func (h *volumeHandler) forget(uid types.UID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.expected, uid)
	delete(h.uncertain, uid)
	delete(h.placedAt, uid)
}

// Handle implements ipc.Handler.
func (h *volumeHandler) Handle(ctx context.Context, vol *storagev1alpha1.CStorVolume) (ipc.Result, error) {
	rf := int(vol.Spec.EffectiveReplicationFactor())
	size, err := storagev1alpha1.Bytes(vol.Spec.Capacity)
	if err != nil || size <= 0 {
		// The CRD admits neither; an object written around it is refused, not wrapped around.
		return ipc.Result{}, ipc.InvalidSpec("capacity %s is not a positive number of bytes within an int64", vol.Spec.Capacity.String())
	}
	replicas, err := h.replicas(ctx, h.c, vol)
	if err != nil {
		return ipc.Result{}, err
	}
	replicas = h.withExpected(vol.UID, replicas)
	if len(replicas) < rf && h.needLiveRead(vol) {
		if replicas, err = h.replicas(ctx, h.live, vol); err != nil {
			return ipc.Result{}, err
		}
	}
	var pools storagev1alpha1.CStorPoolList
	if err := h.c.List(ctx, &pools); err != nil {
		return ipc.Result{}, fmt.Errorf("listing pools: %w", err)
	}
	var nodes corev1.NodeList
	if err := h.c.List(ctx, &nodes); err != nil {
		return ipc.Result{}, fmt.Errorf("listing nodes: %w", err)
	}
	byName := newPlacement(pools.Items, nodes.Items)
	// Replicas being deleted, and those replaceLost deletes now, still hold their pool: a
	// replacement must go elsewhere (on the same pool it would take the name of the one going,
	// whose node may never come back).
	holding := replicas
	replicas, again, err := h.replaceLost(ctx, vol, replicas, byName)
	if err != nil {
		return ipc.Result{}, err
	}
	if len(replicas) == 0 {
		// Nothing placed yet: a volume no pool could ever hold fails now, instead of waiting
		// for pools that would be too small as well. Pool changes still call the handler
		// again (poolToVolumes), so a larger pool, when one comes, is used.
		var claims storagev1alpha1.StoragePoolClaimList
		if err := h.c.List(ctx, &claims); err != nil {
			return ipc.Result{}, fmt.Errorf("listing claims: %w", err)
		}
		if why := neverFits(pools.Items, claims.Items, size); why != "" {
			summarize(vol, rf, replicas, byName)
			return ipc.Result{}, ipc.InvalidSpec("%s", why)
		}
	}
	var (
		blocked, collisions []string
		used                map[string]int64
		placedNow           bool // this call created replicas of a volume with none placed before
	)
	if len(replicas) == 0 && vol.Spec.Source != nil {
		// Placed only once the snapshot (or backup) can fill the replicas: an empty replica
		// must never pass for a restored one.
		res, err := h.checkSource(ctx, vol, size)
		if err != nil {
			return ipc.Result{}, err
		}
		if res != nil {
			summarize(vol, rf, replicas, byName)
			return *res, nil
		}
	}
	if len(replicas) < rf {
		placedNow = len(replicas) == 0
		if used, err = h.poolUsage(ctx); err != nil {
			return ipc.Result{}, err
		}
		// The replicas are independent: create them at once, one write latency for all.
		picks := choosePools(byName.placeable(pools.Items), holding, used, size, rf-len(replicas))
		created := make([]*storagev1alpha1.CStorVolumeReplica, len(picks))
		errs := make([]error, len(picks))
		var wg sync.WaitGroup
		for i, pool := range picks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := newReplica(vol, pool)
				if placedNow && vol.Spec.Source != nil {
					// Only the first replicas fill from the snapshot; one placed later
					// (a replacement) is rebuilt from its peers, which hold newer writes.
					r.Spec.Source = &storagev1alpha1.ReplicaSource{Snapshot: vol.Spec.Source.Snapshot, Backup: vol.Spec.Source.Backup.DeepCopy()}
				}
				// The agent that makes the replica continues this reconcile's trace.
				ipc.InjectTraceContext(ctx, r)
				errs[i] = h.c.Create(ctx, r)
				created[i] = r
			}()
		}
		wg.Wait()
		for i, r := range created {
			switch {
			case apierrors.IsAlreadyExists(errs[i]):
				// Created a moment ago by another operator (before leader election settled),
				// or left by an earlier volume of the same name, on its way out — or, for a
				// name of some other volume and pool, a collision: never counted as placed.
				var existing storagev1alpha1.CStorVolumeReplica
				err := h.live.Get(ctx, client.ObjectKeyFromObject(r), &existing)
				if err != nil && !apierrors.IsNotFound(err) {
					return ipc.Result{}, fmt.Errorf("reading replica %s: %w", r.Name, err)
				}
				switch ref := metav1.GetControllerOf(&existing); {
				case err == nil && (existing.Spec.Volume != vol.Name || existing.Spec.Pool != r.Spec.Pool):
					collisions = append(collisions, fmt.Sprintf("replica name %s is taken by the replica of volume %s on pool %s", r.Name, existing.Spec.Volume, existing.Spec.Pool))
				case ref != nil && ref.UID == vol.UID:
					replicas = append(replicas, existing)
				default:
					blocked = append(blocked, r.Name)
				}
			case errs[i] != nil:
				h.markUncertain(vol.UID)
				return ipc.Result{}, fmt.Errorf("creating replica %s: %w", r.Name, errs[i])
			default:
				h.expect(vol.UID, r)
				replicas = append(replicas, *r)
			}
		}
	}
	grow, err := h.growReplicas(ctx, vol, size, replicas, byName)
	if err != nil {
		return ipc.Result{}, err
	}
	res := resized(vol, size, replicas, summarize(vol, rf, replicas, byName))
	if grow != nil {
		res = *grow
	}
	if placedNow && len(replicas) >= rf {
		h.placed(vol.UID)
	}
	if waitingForAgents(vol, rf) {
		res.HoldStatus = h.holdFor(vol.UID)
	} else {
		h.settled(vol.UID)
	}
	if len(collisions) > 0 {
		// Terminal for this generation (a Warning Event, no retry loop); a pool change
		// calls the handler again, and a freed name is then taken.
		slices.Sort(collisions)
		return ipc.Result{}, ipc.Terminal("name collision: %s", strings.Join(collisions, "; "))
	}
	if len(replicas) < rf {
		if why := shortfall(pools.Items, replicas, used, size); why != "" {
			res.Message += "; " + why
		}
	}
	if len(blocked) > 0 && !res.Ready {
		res.Message += fmt.Sprintf("; replica name(s) %s still taken by a replica being deleted", strings.Join(blocked, ", "))
		res.RequeueAfter = time.Second
	}
	if again > 0 && (res.RequeueAfter == 0 || again < res.RequeueAfter) {
		res.RequeueAfter = again
	}
	return res, nil
}

// replicas lists the volume's replicas, ignoring any left by an earlier volume of the
// same name that the garbage collector has yet to delete.
func (h *volumeHandler) replicas(ctx context.Context, r client.Reader, vol *storagev1alpha1.CStorVolume) ([]storagev1alpha1.CStorVolumeReplica, error) {
	var list storagev1alpha1.CStorVolumeReplicaList
	if err := r.List(ctx, &list, client.InNamespace(vol.Namespace), client.MatchingFields{storagev1alpha1.FieldVolume: vol.Name}); err != nil {
		return nil, fmt.Errorf("listing replicas: %w", err)
	}
	return slices.DeleteFunc(list.Items, func(r storagev1alpha1.CStorVolumeReplica) bool {
		ref := metav1.GetControllerOf(&r)
		return ref == nil || ref.UID != vol.UID
	}), nil
}

// poolUsage is the capacity that replicas take in each pool, from the operator's own
// records rather than the agents' reports, which lag behind placements.
func (h *volumeHandler) poolUsage(ctx context.Context) (map[string]int64, error) {
	if h.usage != nil {
		if used, ok := h.usage.usage(); ok {
			return used, nil
		}
	}
	// Until the tracker has the cache's first list: add them up here, reading the cached
	// replicas in place (nothing here changes them).
	var all storagev1alpha1.CStorVolumeReplicaList
	if err := h.c.List(ctx, &all, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing replicas: %w", err)
	}
	used := map[string]int64{}
	for _, r := range all.Items {
		n, err := storagev1alpha1.Bytes(r.Spec.Capacity)
		if err != nil || n < 0 {
			n = math.MaxInt64 // beyond what the CRD admits: count its pool as full
		}
		used[r.Spec.Pool] = addBytes(used[r.Spec.Pool], n)
	}
	return used, nil
}

func newReplica(vol *storagev1alpha1.CStorVolume, pool *storagev1alpha1.CStorPool) *storagev1alpha1.CStorVolumeReplica {
	return &storagev1alpha1.CStorVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{
			Name:      storagev1alpha1.ReplicaName(vol.Name, pool.Name),
			Namespace: vol.Namespace,
			// Deleting the volume deletes its replicas (garbage collector), and the agents'
			// finalizers delete their data. The agent's finalizer is set here, at creation,
			// as Kubernetes' own protection admission does: a replica is never without it,
			// and the agent saves a write before it can create the data.
			Finalizers: []string{storagev1alpha1.AgentFinalizer},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: storagev1alpha1.GroupVersion.String(), Kind: "CStorVolume",
				Name: vol.Name, UID: vol.UID, Controller: ptr.To(true),
			}},
		},
		Spec: storagev1alpha1.CStorVolumeReplicaSpec{
			Volume:   vol.Name,
			Pool:     pool.Name,
			NodeName: pool.Spec.NodeName,
			Capacity: vol.Spec.Capacity,
		},
	}
}

// placement is what the volume handler knows of the cluster: pools and nodes by name.
type placement struct {
	pools map[string]*storagev1alpha1.CStorPool
	nodes map[string]*corev1.Node
}

func newPlacement(pools []storagev1alpha1.CStorPool, nodes []corev1.Node) placement {
	p := placement{pools: make(map[string]*storagev1alpha1.CStorPool, len(pools)), nodes: make(map[string]*corev1.Node, len(nodes))}
	for i := range pools {
		p.pools[pools[i].Name] = &pools[i]
	}
	for i := range nodes {
		p.nodes[nodes[i].Name] = &nodes[i]
	}
	return p
}

// placeable are the pools a new replica may go to: on a node that is Ready. A pool on a node
// that is not still says Healthy (its agent is down with the node and cannot say otherwise),
// and a replica placed there would only be Offline.
func (v placement) placeable(pools []storagev1alpha1.CStorPool) []storagev1alpha1.CStorPool {
	var out []storagev1alpha1.CStorPool
	for _, p := range pools {
		if n := v.nodes[p.Spec.NodeName]; n != nil && nodeIsReady(n) {
			out = append(out, p)
		}
	}
	return out
}

// replicaPhase is a replica's phase as the volume counts it: a replica reported Healthy on
// a pool that is not (its node was deleted, its directory vanished), or on a node that is
// not Ready (its agent cannot say otherwise: it is down with the node), is not serving,
// and neither is one being deleted.
func replicaPhase(r *storagev1alpha1.CStorVolumeReplica, v placement) storagev1alpha1.ReplicaPhase {
	phase := r.Status.Phase
	if phase == "" {
		phase = storagev1alpha1.ReplicaPhaseInit
	}
	if phase == storagev1alpha1.ReplicaPhaseHealthy || phase == storagev1alpha1.ReplicaPhaseRebuilding {
		p, ok := v.pools[r.Spec.Pool]
		n := v.nodes[r.Spec.NodeName]
		if !ok || (p.Status.Phase != storagev1alpha1.PoolPhaseHealthy && p.Status.Phase != storagev1alpha1.PoolPhaseDegraded) ||
			n == nil || !nodeIsReady(n) || !r.DeletionTimestamp.IsZero() {
			return storagev1alpha1.ReplicaPhaseOffline
		}
	}
	return phase
}

// summarize writes the volume's status from its replicas and returns the verdict.
func summarize(vol *storagev1alpha1.CStorVolume, rf int, replicas []storagev1alpha1.CStorVolumeReplica, v placement) ipc.Result {
	cf := int(vol.Spec.EffectiveConsistencyFactor())
	entries := make([]storagev1alpha1.VolumeReplicaStatus, 0, len(replicas))
	ready, waiting := 0, 0
	var problems []string
	for i := range replicas {
		r := &replicas[i]
		phase := replicaPhase(r, v)
		entries = append(entries, storagev1alpha1.VolumeReplicaStatus{Name: r.Name, Pool: r.Spec.Pool, Node: r.Spec.NodeName, Phase: phase, Endpoint: r.Status.Endpoint, Location: r.Status.Location})
		switch phase {
		case storagev1alpha1.ReplicaPhaseHealthy:
			ready++
		case storagev1alpha1.ReplicaPhaseInit:
			waiting++
		default:
			problems = append(problems, fmt.Sprintf("%s is %s", r.Name, phase))
		}
	}
	slices.SortFunc(entries, func(a, b storagev1alpha1.VolumeReplicaStatus) int { return strings.Compare(a.Name, b.Name) })
	slices.Sort(problems)
	vol.Status.Replicas = entries
	vol.Status.ReadyReplicas = int32(ready)
	vol.Status.DesiredReplicas = int32(rf)
	switch {
	case ready >= rf:
		vol.Status.Phase = storagev1alpha1.VolumePhaseHealthy
	case ready >= cf:
		vol.Status.Phase = storagev1alpha1.VolumePhaseDegraded
	case len(problems) == 0:
		// Below the consistency factor only because replicas are still being created.
		vol.Status.Phase = storagev1alpha1.VolumePhaseInit
	default:
		vol.Status.Phase = storagev1alpha1.VolumePhaseOffline
	}

	switch placed := len(replicas); {
	case ready >= rf:
		return ipc.Done(fmt.Sprintf("%d of %d replicas healthy", ready, rf))
	case placed < rf:
		missing := rf - placed
		return ipc.Waiting(conditions.ReasonWaiting, fmt.Sprintf("%d of %d replicas placed; waiting for %d more %s", placed, rf, missing, plural(missing, "pool")), 0)
	case len(problems) > 0:
		if len(problems) > 3 {
			problems = append(problems[:3], "…")
		}
		return ipc.Result{Reason: conditions.ReasonDegraded, Message: fmt.Sprintf("%d of %d replicas healthy; %s", ready, rf, strings.Join(problems, ", "))}
	default:
		return ipc.Result{Reason: conditions.ReasonReconciling, Message: fmt.Sprintf("%d of %d replicas healthy; %d waiting for their node agents", ready, rf, waiting)}
	}
}

// waitingForAgents reports whether every replica of vol is placed and each is Healthy or
// still Init: nothing is wrong, the agents have yet to report.
func waitingForAgents(vol *storagev1alpha1.CStorVolume, rf int) bool {
	if len(vol.Status.Replicas) < rf || int(vol.Status.ReadyReplicas) >= rf {
		return false
	}
	for _, r := range vol.Status.Replicas {
		if r.Phase != storagev1alpha1.ReplicaPhaseHealthy && r.Phase != storagev1alpha1.ReplicaPhaseInit {
			return false
		}
	}
	return true
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// poolToVolumes maps a pool change to the volumes it may concern: those still missing
// replicas, and those with a replica on the pool.
func (h *volumeHandler) poolToVolumes(ctx context.Context, o client.Object) []reconcile.Request {
	return h.volumesWhere(ctx, func(v *storagev1alpha1.CStorVolume) bool {
		if !v.DeletionTimestamp.IsZero() {
			return false
		}
		concerned := len(v.Status.Replicas) < int(v.Status.DesiredReplicas) || v.Status.DesiredReplicas == 0
		for _, r := range v.Status.Replicas {
			concerned = concerned || r.Pool == o.GetName()
		}
		return concerned
	})
}

// nodeToVolumes maps a node change to the volumes with a replica on the node.
func (h *volumeHandler) nodeToVolumes(ctx context.Context, o client.Object) []reconcile.Request {
	return h.volumesWhere(ctx, func(v *storagev1alpha1.CStorVolume) bool {
		for _, r := range v.Status.Replicas {
			if r.Node == o.GetName() {
				return true
			}
		}
		return false
	})
}

// volumesWhere requests a reconcile of every cached volume that concerned says is.
func (h *volumeHandler) volumesWhere(ctx context.Context, concerned func(*storagev1alpha1.CStorVolume) bool) []reconcile.Request {
	var list storagev1alpha1.CStorVolumeList
	if err := h.c.List(ctx, &list); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		if concerned(&list.Items[i]) {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return reqs
}

// Finalize implements ipc.Finalizer: it deletes the volume's replicas and keeps the volume
// until their agents have destroyed the data, so `kubectl delete cstorvolume` returns once
// the replicas are gone from the nodes (the garbage collector, through the owner
// references, would get there too, but without telling anyone when).
func (h *volumeHandler) Finalize(ctx context.Context, vol *storagev1alpha1.CStorVolume) error {
	replicas, err := h.replicas(ctx, h.live, vol)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(replicas))
	for i := range replicas {
		r := &replicas[i]
		if r.DeletionTimestamp.IsZero() {
			uid := r.UID
			if err := h.c.Delete(ctx, r, client.Preconditions{UID: &uid}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("deleting replica %s: %w", r.Name, err)
			}
		} else if released, err := releaseAbandoned(ctx, h.c, h.live, r, r.Spec.NodeName); err != nil {
			return err
		} else if released {
			continue
		}
		names = append(names, r.Name)
	}
	if len(names) == 0 {
		h.forget(vol.UID)
		return nil
	}
	slices.Sort(names)
	return ipc.Deleting(fmt.Sprintf("waiting for the node agents to delete %d %s: %s", len(names), plural(len(names), "replica"), strings.Join(names, ", ")), 0)
}
