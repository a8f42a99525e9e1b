package metricsagent

import (
	"context"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/crdipc/crdipc/ipc"
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

// labelSet is one series of crdipc_scm_events_total.
type labelSet struct {
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
	Type   string `json:"type"`
}

func labels(ev *corev1.Event) labelSet {
	l := labelSet{Kind: ev.InvolvedObject.Kind, Reason: ev.Reason, Type: ev.Type}
	if !reasons[l.Reason] {
		l.Reason = "Other"
	}
	if l.Type != corev1.EventTypeNormal && l.Type != corev1.EventTypeWarning {
		l.Type = "Other"
	}
	return l
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

var eventsTotalDesc = prometheus.NewDesc("crdipc_scm_events_total",
	"Occurrences of Events about PullRequests and Branches, each counted once; continues from the agent's checkpoint across restarts.",
	[]string{"kind", "reason", "type"}, nil)

// seenEvent is what the counter remembers of one Event.
type seenEvent struct {
	n     int32 // occurrences accounted for, counted or history
	first int64 // firstSeen in Unix nanoseconds (0 until listed): a full checkpoint keeps the newest
}

// state is what a checkpoint holds: the counter's totals and, per Event UID, the
// occurrences accounted for. Events first seen at or before horizon and not in seen are
// accounted for too (a full checkpoint dropped them).
type state struct {
	totals  map[labelSet]uint64
	seen    map[types.UID]int32
	horizon time.Time
}

// eventCounter implements the counting rules of the package comment. It is an informer
// event handler and the collector of crdipc_scm_events_total.
type eventCounter struct {
	start time.Time            // without a checkpoint, Events stamped before it are history
	tp    trace.TracerProvider // of the spans of counted Events that carry a trace; nil: global

	mu      sync.Mutex
	resumed bool      // from a checkpoint: an Event it does not list is new...
	horizon time.Time // ...unless first seen at or before this
	seen    map[types.UID]seenEvent
	totals  map[labelSet]uint64
	// unconfirmed are checkpointed Events the first list has not shown yet; those still
	// unconfirmed once it is handled are gone and are forgotten.
	unconfirmed map[types.UID]bool
	synced      bool   // the first list is handled: totals are exported, checkpoints written
	gen         uint64 // changes of seen and totals, so unchanged states are not rewritten
}

func newEventCounter() *eventCounter {
	return &eventCounter{seen: map[types.UID]seenEvent{}, totals: map[labelSet]uint64{}}
}

// resume continues from a checkpoint; call it before the informer delivers anything.
func (c *eventCounter) resume(s state) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resumed, c.horizon = true, s.horizon
	c.totals = maps.Clone(s.totals)
	c.unconfirmed = make(map[types.UID]bool, len(s.seen))
	for uid, n := range s.seen {
		c.seen[uid] = seenEvent{n: n}
		c.unconfirmed[uid] = true
	}
}

// markSynced is called once the handler has been given the whole first list: it forgets
// checkpointed Events that are gone, and from now on the totals are exported.
func (c *eventCounter) markSynced() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for uid := range c.unconfirmed {
		delete(c.seen, uid)
		c.gen++
	}
	c.unconfirmed, c.synced = nil, true
}

// snapshot is the state to checkpoint and its generation, taken under one lock so the
// totals and what they account for agree.
func (c *eventCounter) snapshot() (state, map[types.UID]int64, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := state{totals: maps.Clone(c.totals), seen: make(map[types.UID]int32, len(c.seen))}
	first := make(map[types.UID]int64, len(c.seen))
	for uid, e := range c.seen {
		s.seen[uid], first[uid] = e.n, e.first
	}
	return s, first, c.gen
}

func (c *eventCounter) add(ev *corev1.Event, n int32) {
	if n > 0 {
		l := labels(ev)
		c.totals[l] += uint64(n)
		c.gen++
		c.traceCount(ev, l, n)
	}
}

// traceCount records the counting of ev in the trace ev carries, if any: the last step of
// a webhook delivery, whose listener stored its trace on the Event. Events without one
// start no trace.
func (c *eventCounter) traceCount(ev *corev1.Event, l labelSet, n int32) {
	if ev.Annotations[ipc.TraceParentAnnotation] == "" {
		return
	}
	_, span := ipc.StartSpan(context.Background(), c.tp, "count Event", ev)
	span.SetAttributes(attribute.String("scm.kind", l.Kind), attribute.String("scm.reason", l.Reason), attribute.Int("scm.occurrences", int(n)))
	span.End()
}

// OnAdd: an Event the counter already knows (a re-list, or the first list after a restart
// from a checkpoint) adds the growth of its count. An unknown Event in the first list is:
// with a checkpoint, new (it was created after the checkpoint), unless first seen at or
// before the checkpoint's horizon; without one, history unless stamped after the agent
// started (it happened between process start and the list). Any later Add, from the watch
// or a re-list after the watch broke, is an Event that did not exist when we last looked: new.
func (c *eventCounter) OnAdd(obj any, isInInitialList bool) {
	ev, ok := obj.(*corev1.Event)
	if !ok || !relevant(ev) {
		return
	}
	n, first := occurrences(ev), firstSeen(ev)
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.unconfirmed, ev.UID)
	if prev, ok := c.seen[ev.UID]; ok {
		c.add(ev, n-prev.n)
		c.seen[ev.UID] = seenEvent{n: max(n, prev.n), first: first.UnixNano()}
		return
	}
	c.seen[ev.UID] = seenEvent{n: n, first: first.UnixNano()}
	c.gen++
	switch {
	case !isInInitialList:
		c.add(ev, n)
	case c.resumed:
		if c.horizon.IsZero() || first.After(c.horizon) {
			c.add(ev, n)
		}
	case first.After(c.start):
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
	n, first := occurrences(ev), firstSeen(ev).UnixNano()
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.unconfirmed, ev.UID)
	prev, ok := c.seen[ev.UID]
	if !ok {
		// Not seen before under this UID: the name was reused by a new Event.
		c.seen[ev.UID] = seenEvent{n: n, first: first}
		c.gen++
		c.add(ev, n)
		return
	}
	c.add(ev, n-prev.n)
	c.seen[ev.UID] = seenEvent{n: max(n, prev.n), first: first}
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
	defer c.mu.Unlock()
	delete(c.unconfirmed, ev.UID)
	if _, ok := c.seen[ev.UID]; ok {
		delete(c.seen, ev.UID)
		c.gen++
	}
}

func (c *eventCounter) Describe(ch chan<- *prometheus.Desc) { ch <- eventsTotalDesc }

// Collect exports nothing until the first list is handled: before that the totals lack the
// Events created while no agent ran, and a lower value would read as a counter reset.
func (c *eventCounter) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.synced {
		return
	}
	for l, v := range c.totals {
		ch <- prometheus.MustNewConstMetric(eventsTotalDesc, prometheus.CounterValue, float64(v), l.Kind, l.Reason, l.Type)
	}
}
