// Package cli holds crdipc's subcommands, one file each, wired with cobra.
package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

// NewRoot returns the crdipc command with every subcommand.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "crdipc",
		Short: "Services that talk through Kubernetes custom resources",
		Long: `crdipc makes Kubernetes custom resources the channel between services.
A sender writes a request as a custom resource (durable, visible with kubectl);
a receiver reconciles it and reports the outcome in the same object's status;
Events and Prometheus metrics show what happened.

Start everything on this machine with "crdipc up", then use kubectl with the
KUBECONFIG it prints.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(
		newUpCommand(),
		newInstallCommand(),
		newCallCommand(),
		newBooksCommand(),
		newWebhookListenerCommand(),
		newMetricsAgentCommand(),
		newBenchCommand(),
	)
	return root
}

// exitError carries a process exit code for errors that scripts branch on,
// e.g. `crdipc call`'s terminal failure (1) versus timeout (2).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// ExitCode is the process exit code for an error a command returned.
func ExitCode(err error) int {
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	return 1
}
