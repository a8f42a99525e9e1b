package agent

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// catchUp is the agent's readiness: ready once it holds the node Lease and every replica
// of its node that a target writes has been caught up. A DaemonSet rolls the next node's
// agent only when this one is ready; were it ready as soon as it answered, a rolling
// restart would take a second replica of a volume down while the first still missed the
// writes made without it, and the volume would be short of quorum (its writes pause) until
// that rebuild ended.
//
// The wait is bounded (Options.CatchUpTimeout, from taking the Lease): a rebuild that
// cannot finish (its source is gone, its disk is full) must not stop every later rollout,
// and the replica's own status says what is wrong with it.
type catchUp struct {
	node    string
	cache   client.Reader
	data    *dataServer // nil: the agent serves no data; nothing to catch up
	timeout time.Duration
	log     logr.Logger

	mu     sync.Mutex
	since  time.Time // when this manager took the node Lease; zero: not yet
	gaveUp bool
	// observed is the phase each replica's last reconcile by this process found; "" when
	// the data service could not be asked (the phase in the status is an older one's).
	observed map[types.UID]storagev1alpha1.ReplicaPhase
}

func (c *catchUp) leading(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.since = now
}

// observe records what the reconcile of replica uid found.
func (c *catchUp) observe(uid types.UID, phase storagev1alpha1.ReplicaPhase) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.observed == nil {
		c.observed = map[types.UID]storagev1alpha1.ReplicaPhase{}
	}
	c.observed[uid] = phase
}

// check implements healthz.Checker: its error, which /readyz?verbose shows, names the
// replicas still waited for and why.
func (c *catchUp) check(req *http.Request) error {
	c.mu.Lock()
	since, gaveUp := c.since, c.gaveUp
	c.mu.Unlock()
	if since.IsZero() {
		return errors.New("waiting for the node lease")
	}
	if c.data == nil || gaveUp {
		return nil
	}
	var list storagev1alpha1.CStorVolumeReplicaList
	if err := c.cache.List(req.Context(), &list); err != nil {
		return fmt.Errorf("listing the node's replicas: %w", err)
	}
	var behind []string
	for i := range list.Items {
		r := &list.Items[i]
		if r.Spec.NodeName != c.node || !r.DeletionTimestamp.IsZero() {
			continue
		}
		if why := c.behind(req, r); why != "" {
			behind = append(behind, r.Namespace+"/"+r.Name+": "+why)
		}
	}
	if len(behind) == 0 {
		return nil
	}
	slices.Sort(behind)
	if waited := time.Since(since); waited > c.timeout {
		c.mu.Lock()
		c.gaveUp = true
		c.mu.Unlock()
		c.log.Info("ready although replicas have not caught up: waited the longest allowed (--catch-up-timeout)", "waited", waited.Round(time.Second), "replicas", behind)
		return nil
	}
	return fmt.Errorf("not caught up: %s", strings.Join(behind, "; "))
}

// behind says why replica r is not caught up, or "" if it is, or if no wait would help.
func (c *catchUp) behind(req *http.Request, r *storagev1alpha1.CStorVolumeReplica) string {
	c.mu.Lock()
	phase, seen := c.observed[r.UID]
	c.mu.Unlock()
	switch {
	case !seen:
		return "not checked since the agent started"
	case phase == "":
		return "its data could not be checked yet"
	case phase != storagev1alpha1.ReplicaPhaseRebuilding:
		return "" // Healthy; or Init, Offline, Error: no wait helps, its status says why
	}
	// Asked now rather than at the next reconcile: a target polls its rebuilding replicas
	// faster than the agent requeues them. Only these are asked: a probe every second
	// costs nothing once every replica is caught up.
	d := c.data
	self, err := d.client(req.Context(), d.endpoint, storagev1alpha1.ReplicaDataID(r.Namespace, r.Name))
	if err != nil {
		return fmt.Sprintf("replica data service: %v", err)
	}
	info, err := self.Info(req.Context())
	if err != nil {
		return fmt.Sprintf("replica data service: %v", err)
	}
	switch {
	case info.Rebuilding:
		return fmt.Sprintf("rebuilding, %d of %d bytes copied", info.RebuildDone, info.RebuildTotal)
	case info.Session:
		return ""
	default:
		// The agent found that a target writes the volume without this replica (it was
		// down while the target went on): the target takes it back in within seconds.
		return "waiting for the volume's target to take it back in"
	}
}
