// Package storagecluster starts, for an integration test, the storage system `crdipc up`
// runs: the storage operator, N simulated nodes (package simnode) and one pool agent per
// node (agent.Supervisor), on one manager against the package's control plane
// (testenv.Get). Tests that need storage as a given, not as the thing they test, start it
// with one call instead of repeating the wiring.
package storagecluster
