// Package upproc runs `crdipc up` as a user does, as a process of its own, for the
// process-level tests (test/e2e, test/realnode): it starts it, returns once up printed its
// `export KUBECONFIG=` line, keeps its output (stdout and stderr, in the order printed), and
// stops it with Ctrl-C when the test ends. The process is a kubectl.Client on the cluster
// it serves, whose failures show up's last output.
package upproc
