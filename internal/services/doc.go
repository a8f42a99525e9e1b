// Package services is crdipc's table of services. Each entry names one service (its
// subcommand, its ServiceAccount crdipc-<name> and its config/rbac/<name>), its options and
// flags, and how it joins a controller-runtime manager: controllers registered on it, or
// manager.Runnables for the servers (webhook listener, metrics agent, CSI gRPC and HTTP).
//
// Every way of running a service goes through an entry: `crdipc <service>` runs exactly one
// entry in its own process (Run); `crdipc up` runs the entries it selects (Select) in one
// process, each on a manager of its own under its own ServiceAccount; bench and tests run the
// same entries. So a service behaves the same wherever it runs.
package services
