// Package agent is the node-local pool agent of seed 000 (cstor-pool-mgmt): it executes
// the pool and replica operations that the operator requests through CStorPool and
// CStorVolumeReplica objects, and reports the outcome in their status. It never talks to
// the operator directly.
//
// One agent serves one node. It lists and watches only the objects whose spec.nodeName is
// its node (a CRD selectable field, so the API server filters), and it holds the node's
// Lease (storagev1alpha1.NodeLeaseName: pool-agent-<node> in crdipc-system, through leader
// election) before it acts: a second agent started for the same node stands by until the
// first is gone.
//
// Operations go through a backend (internal/storage/backend) and are idempotent: a pool
// or replica past Init is imported/stat'ed, never created again, and what is found on
// disk after a restart is adopted. Deletion runs through finalizers: destroy the data,
// treat not-found as success, then release. A pool that still holds replicas is not
// deleted. Every object is re-checked each resync period, so a pool directory or replica
// file that disappears behind the agent's back turns Offline.
//
// A replica whose spec.capacity grew is grown through the backend (never shrunk), the node's
// replica data service is told (open sessions see the new size), and status.capacity.total
// reports it; a growth the pool has no room for is reported (reason Resizing) and retried.
//
// Supervisor runs agents for the simulated nodes of `crdipc up` (package simnode)
// in-process.
package agent
