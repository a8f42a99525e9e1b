package cli

import (
	"context"
	"log/slog"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"

	"github.com/crdipc/crdipc/internal/scm/metricsagent"
)

func newMetricsAgentCommand() *cobra.Command {
	var (
		kubeconfig, logFormat string
		opts                  = metricsagent.Options{Addr: ":9102", Resync: metricsagent.DefaultResync}
	)
	cmd := &cobra.Command{
		Use:   "metrics-agent",
		Short: "Serve Prometheus metrics from PullRequest/Branch Events and resources",
		Long: `metrics-agent watches core/v1 Events about PullRequests and Branches and the
resources themselves, and serves on /metrics:

  crdipc_scm_events_total{kind,reason,type}  each Event occurrence since start, once
  crdipc_scm_pullrequests{state}             open, closed, merged pull requests now
  crdipc_scm_branches{state}                 created, pushed, deleted branches now

Events that existed when the agent started are history and are not counted; a
re-list after a broken watch counts nothing twice. Like every Prometheus
counter, crdipc_scm_events_total starts at 0 in a new process: use rate() or
increase(), which handle the reset. The gauges come from the resources and are
right from the first scrape after /readyz turns ready.

Run one replica: it writes nothing, so there is nothing to elect a leader for,
and two replicas would each report every Event.`,
		Example: `  crdipc metrics-agent --namespace scm --listen :9102`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSlogService(cmd, logFormat, kubeconfig, func(ctx context.Context, cfg *rest.Config, logger *slog.Logger) error {
				opts.Config, opts.Logger = cfg, logger
				a, err := metricsagent.New(opts)
				if err != nil {
					return err
				}
				return a.Run(ctx)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
	f.StringVar(&opts.Namespace, "namespace", "", "watch only this namespace (default: all namespaces)")
	f.StringVar(&opts.Addr, "listen", opts.Addr, "address for /metrics, /healthz and /readyz")
	f.DurationVar(&opts.Resync, "resync", opts.Resync, "informer resync period (replays the cache; counts nothing)")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	return cmd
}
