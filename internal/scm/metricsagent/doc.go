// Package metricsagent is the Prometheus agent of seed 003: it watches core/v1 Events about
// PullRequests and Branches (scm.crdipc.io) and the resources themselves, and serves
//
//	crdipc_scm_events_total{kind,reason,type}   counter: Event occurrences, across restarts
//	crdipc_scm_pullrequests{state}              gauge: open, closed, merged pull requests now
//	crdipc_scm_branches{state}                  gauge: created, pushed, deleted branches now
//
// on /metrics with its own registry.
//
// Counting exactly once. Seed 003's agent incremented on every watch notification, so each
// re-list after a dropped watch counted every Event again. Here each Event (by UID) remembers
// how many of its occurrences (its count) are already accounted for: an update adds only the
// difference, a re-list adds nothing for Events already seen, a deletion adds nothing.
//
// Restarts. The counter's state is checkpointed in a ConfigMap in the agent's namespace
// (crdipc-metrics-agent-checkpoint): the totals per label set and, per Event UID, the
// occurrences accounted for, in one object, so a restart reads one consistent state. A new
// agent continues the totals from it and counts every occurrence the checkpoint does not
// account for: Events created or repeated while no agent ran, and those counted after the
// last checkpoint. So the counter after a restart is exactly the value before it plus what
// happened meanwhile, nothing lost and nothing counted twice. Checkpointed Events the first
// list no longer shows have expired and are forgotten, which bounds the set by the API
// server's event TTL (1h). The checkpoint is written once the first list is handled, every
// CheckpointInterval when something changed, and on shutdown.
//
// A crash loses at most the checkpoint's last interval, and that part is counted again from
// the checkpoint: the Events are still there. Until its first list is handled the agent
// exports no count, so Prometheus never sees the checkpoint's older value (a drop it would
// read as a counter reset). What is lost: occurrences after the last checkpoint of Events
// that expire before an agent lists again, that is, an outage longer than the event TTL.
//
// One writer. Writes carry the resourceVersion last read or written. An agent claims the
// checkpoint at start, before counting, by writing itself in as its holder; the older agent's
// next write conflicts, it reads the holder and stops writing (it counts on, unwritten). The
// newer agent counts everything after its claim, including what the older one counted and did
// not write, so neither both count into the checkpoint nor anything falls between them. Two
// agents at once still each export every Event; run one replica (the Deployment recreates).
//
// First start. Without a checkpoint (or with one of another watched namespace) Events present
// at start are history: remembered, not counted, except occurrences stamped after the start;
// so upgrading to a checkpointing agent does not inflate the counter.
//
// Size. A ConfigMap holds 1 MiB; an Event takes about 17 bytes (its UID as 16 bytes and its
// count as a varint), so some 60,000 Events fit, far more than an hour of deliveries. If more
// exist, the checkpoint keeps the Events first seen latest and records as its horizon the
// latest first-seen time it left out: an Event not in the checkpoint and first seen at or
// before the horizon is taken as accounted for, so nothing is counted twice, and only the
// growth of such an old Event's count while no agent runs is lost.
//
// A checkpoint the agent cannot read (another format, damaged) stops it with an error naming
// the ConfigMap: deleting it starts afresh as a first start, rather than silently resetting.
// The gauges are read from the resources at scrape time, so they are right from the first
// scrape after the caches sync, whatever happened before.
package metricsagent
