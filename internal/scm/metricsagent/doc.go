// Package metricsagent is the Prometheus agent of seed 003: it watches core/v1 Events about
// PullRequests and Branches (scm.crdipc.io) and the resources themselves, and serves
//
//	crdipc_scm_events_total{kind,reason,type}   counter: Event occurrences since the agent started
//	crdipc_scm_pullrequests{state}              gauge: open, closed, merged pull requests now
//	crdipc_scm_branches{state}                  gauge: created, pushed, deleted branches now
//
// on /metrics with its own registry.
//
// Counting exactly once. Seed 003's agent incremented on every watch notification, so each
// re-list after a dropped watch counted every Event again. Here each Event (by UID) remembers
// how many of its occurrences (its count) are already accounted for: an update adds only the
// difference, a re-list adds nothing for Events already seen, a deletion adds nothing.
// Events present when the agent starts are history, not news: they are remembered but not
// counted, except occurrences stamped after the agent's start time.
//
// Restarts. A counter starts at 0 in a new process, as every Prometheus counter does;
// rate() and increase() treat the drop as a reset. The new process counts every occurrence
// after its start, and nothing from before, so increase() over a restart is not inflated by
// history. The gauges are read from the resources at scrape time, so they are right from the
// first scrape after the caches sync, whatever happened before.
package metricsagent
