// Package e2e tests crdipc's CSI driver and sidecar together on the embedded control plane,
// with the storage operator and simulated nodes of seed 000 underneath: the upstream CSI
// sanity suite over a real Unix socket, provisioning, attaching, deletion, retries while
// nodes are missing, a driver restart mid-call, and the shipped RBAC by impersonation.
package e2e
