// Package cli holds crdipc's subcommands, one file each, wired with cobra.
package cli

import (
	"errors"
	"runtime/debug"

	"github.com/spf13/pflag"

	"github.com/spf13/cobra"

	"github.com/crdipc/crdipc"
	"github.com/crdipc/crdipc/internal/services"
)

// NewRoot returns the crdipc command with every subcommand.
func NewRoot() *cobra.Command {
	// Kubernetes packages register flags of their own binaries (--version of
	// kube-apiserver, klog's) on the global flag set at init; cobra would
	// show them on every crdipc command, where they do nothing.
	pflag.CommandLine = pflag.NewFlagSet("crdipc", pflag.ExitOnError)
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
		Version:       version(),
	}
	root.AddCommand(
		newUpCommand(),
		newInstallCommand(),
		newKubeconfigCommand(),
		newCallCommand(),
		newBenchCommand(),
		newVersionCommand(),
		newFDHolderCommand(),
		newBackupCommand(),
	)
	for _, e := range services.Table() {
		root.AddCommand(newServiceCommand(e))
	}
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

// version is the module version the binary was built from ("(devel)" for
// a build from a checkout) and its VCS revision when known.
// version is crdipc's release version and, when the build recorded it, the commit.
func version() string {
	v := crdipc.Version()
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " (" + s.Value[:12] + ")"
			}
		}
	}
	return v
}
