package console

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bitcoinv1alpha1 "github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/ipc"
)

// maxCompletions bounds the recent completions kept (and shown).
const maxCompletions = 30

// requestKind is a kind whose objects are requests: the status contract's Ready condition
// says when one is done.
type requestKind struct {
	kind      string
	newObject func() client.Object
}

var requestKinds = []requestKind{
	{"Book", func() client.Object { return &libraryv1alpha1.Book{} }},
	{"StoragePoolClaim", func() client.Object { return &storagev1alpha1.StoragePoolClaim{} }},
	{"CStorVolume", func() client.Object { return &storagev1alpha1.CStorVolume{} }},
	{"BitcoinNetwork", func() client.Object { return &bitcoinv1alpha1.BitcoinNetwork{} }},
	{"VolumeBackup", func() client.Object { return &storagev1alpha1.VolumeBackup{} }},
}

// Completion is a request that became done: Ready=True (Succeeded) or a terminal reason.
type Completion struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	Succeeded bool   `json:"succeeded"`
	Reason    string `json:"reason,omitempty"`
	Message   string `json:"message,omitempty"`
	// LatencyMS is how long the request took, from when it was created (or its current
	// generation or last regression was first seen) to done; -1 when unknown.
	LatencyMS int64 `json:"latencyMs"`
	// Approx is set when the latency comes from API timestamps (whole seconds) because the
	// console did not see the request start: it was already in flight or done when it began.
	Approx bool      `json:"approx,omitempty"`
	At     time.Time `json:"at"`
	// TraceID is the trace of the request's latest call, 32 hex digits; empty when the
	// request carries no valid trace context.
	TraceID string `json:"traceId,omitempty"`
}

// traceIDOf returns the trace of o's trace context annotation, or "" when it has none or
// an invalid one. It is read as the services that continue the trace read it: what they
// would not follow, the console does not link.
func traceIDOf(o metav1.Object) string {
	if sc := trace.SpanContextFromContext(ipc.ExtractTraceContext(context.Background(), o)); sc.IsValid() {
		return sc.TraceID().String()
	}
	return ""
}

// started is when the console first saw a request's current in-flight period.
type started struct {
	generation int64
	at         time.Time
	// live: seen as it happened, not in the informers' initial list.
	live bool
}

// tracker times requests from the informers' events and keeps the requests in flight, so
// that a snapshot costs what is in flight, not a list of every request in the cluster (at
// 10,000 Books in up, such lists were 6.7 s of a run's 245 s of CPU). Its maps hold one
// entry per request in the cache (forget drops it on delete); its completions are capped.
type tracker struct {
	mu          sync.Mutex
	started     map[types.UID]started
	done        map[types.UID]int64 // generation recorded as complete
	inFlight    map[types.UID]Request
	completions []Completion // newest first
}

func newTracker() *tracker {
	return &tracker{started: map[types.UID]started{}, done: map[types.UID]int64{}, inFlight: map[types.UID]Request{}}
}

// readyState reads the status contract: whether o is done for its current generation, and
// whether it succeeded.
func readyState(o conditions.Object) (done, succeeded bool, ready *metav1.Condition) {
	c := meta.FindStatusCondition(o.GetConditions(), conditions.TypeReady)
	if c == nil || o.GetObservedGeneration() < o.GetGeneration() {
		return false, false, c
	}
	switch {
	case c.Status == metav1.ConditionTrue:
		return true, true, c
	case conditions.IsTerminal(c.Reason):
		return true, false, c
	}
	return false, false, c
}

// observe records o's state as seen at now; initial is true for the informers' first list.
func (t *tracker) observe(kind string, o conditions.Object, initial bool, now time.Time) {
	done, ok, ready := readyState(o)
	uid, gen := o.GetUID(), o.GetGeneration()
	t.mu.Lock()
	defer t.mu.Unlock()
	if !done {
		// Done before and not now (a volume lost a replica): a new period of work begins.
		delete(t.done, uid)
		s, seen := t.started[uid]
		if !seen || s.generation != gen {
			s = started{generation: gen, at: now, live: !initial}
			t.started[uid] = s
		}
		r := Request{
			Kind: kind, Namespace: o.GetNamespace(), Name: o.GetName(), Reason: conditions.ReasonPending,
			Since: o.GetCreationTimestamp().Time, TraceID: traceIDOf(o),
		}
		if ready != nil {
			r.Reason, r.Message = ready.Reason, ready.Message
		}
		if s.live {
			r.Since = s.at
		}
		t.inFlight[uid] = r
		return
	}
	delete(t.inFlight, uid)
	if g, recorded := t.done[uid]; recorded && g == gen {
		return
	}
	t.done[uid] = gen
	c := Completion{Kind: kind, Namespace: o.GetNamespace(), Name: o.GetName(), Succeeded: ok, LatencyMS: -1, At: now, TraceID: traceIDOf(o)}
	if ready != nil {
		c.Reason, c.Message = ready.Reason, ready.Message
	}
	if s, seen := t.started[uid]; seen && s.live {
		c.LatencyMS = now.Sub(s.at).Milliseconds()
	} else if ready != nil && gen <= 1 {
		// Not seen starting: the API's timestamps, in whole seconds, are all there is.
		c.At = ready.LastTransitionTime.Time
		c.LatencyMS = max(0, ready.LastTransitionTime.Sub(o.GetCreationTimestamp().Time).Milliseconds())
		c.Approx = true
	} else if ready != nil {
		c.At = ready.LastTransitionTime.Time
	}
	delete(t.started, uid)
	t.completions = append(t.completions, c)
	// Stable: the initial list delivers old completions in any order.
	slices.SortStableFunc(t.completions, func(a, b Completion) int { return b.At.Compare(a.At) })
	if len(t.completions) > maxCompletions {
		t.completions = t.completions[:maxCompletions]
	}
}

// forget drops what the tracker keeps about a deleted request; its completion stays listed.
func (t *tracker) forget(uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.started, uid)
	delete(t.done, uid)
	delete(t.inFlight, uid)
}

// oldestInFlight returns the n requests in flight that have waited longest (what someone
// is looking for), oldest first, and how many are in flight. It keeps only those n while
// it looks: during a burst of creates, thousands may be in flight at every snapshot.
func (t *tracker) oldestInFlight(n int) (_ []Request, total int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Request, 0, min(n, len(t.inFlight)))
	for _, r := range t.inFlight {
		if len(out) == n && (n == 0 || olderFirst(r, out[n-1]) > 0) {
			continue
		}
		i, _ := slices.BinarySearchFunc(out, r, olderFirst)
		if len(out) < n {
			out = slices.Insert(out, i, r)
			continue
		}
		copy(out[i+1:], out[i:n-1])
		out[i] = r
	}
	return out, len(t.inFlight)
}

// olderFirst orders requests by how long they have waited; the rest only makes it total.
func olderFirst(a, b Request) int {
	return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
}

func (t *tracker) recent() []Completion {
	t.mu.Lock()
	defer t.mu.Unlock()
	// Never nil: the page reads it as a list.
	return append([]Completion{}, t.completions...)
}
