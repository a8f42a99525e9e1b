// Package kubectl runs kubectl, and any command that reads $KUBECONFIG, against one cluster
// for the process-level tests (test/e2e, test/realnode): as a user's shell does, with the
// cluster's kubeconfig exported. Its waits fail with the cluster's state (nodes, pods,
// events, and what the test adds), which a failure needs to be understood.
package kubectl
