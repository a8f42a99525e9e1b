package metricsagent

import (
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// Group is the API group whose Events the agent counts.
const Group = "scm.crdipc.io"

// reasons bounds the reason label to what the webhook listener writes: the pull_request
// actions GitHub documents, plus merges and the three branch reasons. Anything else anyone
// else writes is counted as "Other" instead of growing a series per string.
var reasons = func() map[string]bool {
	m := map[string]bool{"PullRequestMerged": true, "BranchCreated": true, "BranchPushed": true, "BranchDeleted": true}
	for _, a := range []string{
		"Assigned", "AutoMergeDisabled", "AutoMergeEnabled", "Closed", "ConvertedToDraft", "Demilestoned",
		"Dequeued", "Edited", "Enqueued", "Labeled", "Locked", "Milestoned", "Opened", "ReadyForReview",
		"Reopened", "ReviewRequestRemoved", "ReviewRequested", "Synchronize", "Unassigned", "Unlabeled", "Unlocked",
	} {
		m["PullRequest"+a] = true
	}
	return m
}()

func labels(ev *corev1.Event) (kind, reason, typ string) {
	kind, reason, typ = ev.InvolvedObject.Kind, ev.Reason, ev.Type
	if !reasons[reason] {
		reason = "Other"
	}
	if typ != corev1.EventTypeNormal && typ != corev1.EventTypeWarning {
		typ = "Other"
	}
	return kind, reason, typ
}

// relevant: Events about a PullRequest or a Branch of any version of the group. The API
// server filters by apiVersion already; this also drops anything a cache might hold.
func relevant(ev *corev1.Event) bool {
	group, _, _ := strings.Cut(ev.InvolvedObject.APIVersion, "/")
	k := ev.InvolvedObject.Kind
	return group == Group && (k == "PullRequest" || k == "Branch")
}

// occurrences is how many times an Event has happened: count for core/v1 writers, the series
// count for events.k8s.io writers, at least 1.
func occurrences(ev *corev1.Event) int32 {
	n := ev.Count
	if ev.Series != nil && ev.Series.Count > n {
		n = ev.Series.Count
	}
	return max(n, 1)
}

// firstSeen and lastSeen are the best-precision times of an Event's first and last
// occurrence: eventTime is microseconds, the legacy timestamps are seconds.
func firstSeen(ev *corev1.Event) time.Time {
	switch {
	case !ev.EventTime.IsZero():
		return ev.EventTime.Time
	case !ev.FirstTimestamp.IsZero():
		return ev.FirstTimestamp.Time
	}
	return ev.CreationTimestamp.Time
}

func lastSeen(ev *corev1.Event) time.Time {
	switch {
	case ev.Series != nil && !ev.Series.LastObservedTime.IsZero():
		return ev.Series.LastObservedTime.Time
	case !ev.LastTimestamp.IsZero():
		return ev.LastTimestamp.Time
	}
	return firstSeen(ev)
}

// eventCounter implements the counting rules of the package comment. It is an informer
// event handler.
type eventCounter struct {
	start time.Time
	total *prometheus.CounterVec

	mu   sync.Mutex
	seen map[types.UID]int32 // occurrences accounted for, counted or history
}

func newEventCounter(start time.Time, total *prometheus.CounterVec) *eventCounter {
	return &eventCounter{start: start, total: total, seen: map[types.UID]int32{}}
}

func (c *eventCounter) add(ev *corev1.Event, n int32) {
	if n <= 0 {
		return
	}
	kind, reason, typ := labels(ev)
	c.total.WithLabelValues(kind, reason, typ).Add(float64(n))
}

// OnAdd: in the initial list an Event is history unless stamped after the agent started
// (it happened between process start and the list). Any later Add, from the watch or from a
// re-list after the watch broke, is an Event that did not exist when we last looked: new.
func (c *eventCounter) OnAdd(obj any, isInInitialList bool) {
	ev, ok := obj.(*corev1.Event)
	if !ok || !relevant(ev) {
		return
	}
	n := occurrences(ev)
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.seen[ev.UID]; ok {
		if n > prev {
			c.add(ev, n-prev)
			c.seen[ev.UID] = n
		}
		return
	}
	c.seen[ev.UID] = n
	switch {
	case !isInInitialList:
		c.add(ev, n)
	case firstSeen(ev).After(c.start):
		c.add(ev, n)
	case lastSeen(ev).After(c.start):
		// Repeated across the start: at least the last occurrence is new; how many of the
		// others are cannot be known, and counting them could count history.
		c.add(ev, 1)
	}
}

// OnUpdate adds the growth of count since it was last accounted for; periodic resyncs and
// re-lists deliver the same count and add nothing.
func (c *eventCounter) OnUpdate(_, newObj any) {
	ev, ok := newObj.(*corev1.Event)
	if !ok || !relevant(ev) {
		return
	}
	n := occurrences(ev)
	c.mu.Lock()
	defer c.mu.Unlock()
	prev, ok := c.seen[ev.UID]
	if !ok {
		// Not seen before under this UID: the name was reused by a new Event.
		c.seen[ev.UID] = n
		c.add(ev, n)
		return
	}
	if n > prev {
		c.add(ev, n-prev)
		c.seen[ev.UID] = n
	}
}

// OnDelete counts nothing: an Event expiring (the API server's event TTL) is not an
// occurrence. It forgets the UID so the map does not grow forever.
func (c *eventCounter) OnDelete(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	ev, ok := obj.(*corev1.Event)
	if !ok {
		return
	}
	c.mu.Lock()
	delete(c.seen, ev.UID)
	c.mu.Unlock()
}
