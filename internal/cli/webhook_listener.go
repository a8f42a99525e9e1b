package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/crdipc/crdipc/internal/scm/webhook"
)

func newWebhookListenerCommand() *cobra.Command {
	var (
		kubeconfig, secretFile, logFormat string
		opts                              = webhook.Options{Namespace: "default", Addr: ":8090", MaxBodyBytes: webhook.DefaultMaxBodyBytes, Timeout: webhook.DefaultTimeout}
	)
	cmd := &cobra.Command{
		Use:   "webhook-listener",
		Short: "Turn GitHub webhook deliveries into PullRequest and Branch resources and Events",
		Long: `webhook-listener receives GitHub webhooks on POST /webhook and writes, for
pull_request, create, delete and push deliveries, a PullRequest or Branch
(scm.crdipc.io) with a deterministic name, plus one core/v1 Event per delivery
named <object>.<X-GitHub-Delivery>: a redelivery changes nothing.

Every delivery must carry X-Hub-Signature-256 made with the webhook secret; the
listener refuses to start without one (--secret-file, or $` + webhook.SecretEnv + `).
It answers 2xx only after the object and the Event are stored, 4xx with the
reason for input that can never succeed, and 503 when the API server is
unreachable, so GitHub shows the delivery as failed and it can be redelivered.

/healthz, /readyz (API server reachable) and /metrics share the listen address.
Replicas do not need a leader: every write is idempotent and ordered.`,
		Example: `  crdipc webhook-listener --secret-file /etc/crdipc/webhook-secret --namespace scm
  CRDIPC_WEBHOOK_SECRET=s3cret crdipc webhook-listener --listen 127.0.0.1:8090`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			secret, err := webhook.LoadSecret(secretFile)
			if err != nil {
				return err
			}
			return runSlogService(cmd, logFormat, kubeconfig, func(ctx context.Context, cfg *rest.Config, logger *slog.Logger) error {
				opts.Config, opts.Secret, opts.Logger = cfg, secret, logger
				l, err := webhook.New(opts)
				if err != nil {
					return err
				}
				return l.Run(ctx)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
	f.StringVar(&opts.Namespace, "namespace", opts.Namespace, "namespace for PullRequests, Branches and their Events")
	f.StringVar(&opts.Addr, "listen", opts.Addr, "address for /webhook, /healthz, /readyz and /metrics")
	f.StringVar(&secretFile, "secret-file", "", "file holding the webhook secret (default: $"+webhook.SecretEnv+")")
	f.Int64Var(&opts.MaxBodyBytes, "max-body-bytes", opts.MaxBodyBytes, fmt.Sprintf("largest body accepted (GitHub sends at most %d)", webhook.MaxMaxBodyBytes))
	f.DurationVar(&opts.Timeout, "timeout", opts.Timeout, "budget for storing one delivery; GitHub waits 10s")
	f.StringVar(&opts.Instance, "instance", "", "Events' reportingInstance (default: host name)")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	return cmd
}

// runSlogService is the body of the services that do not run on a controller-runtime
// manager: a structured logger in the given format (also behind controller-runtime's
// logger), the cluster's config, and run until SIGINT/SIGTERM.
func runSlogService(cmd *cobra.Command, format, kubeconfig string, run func(context.Context, *rest.Config, *slog.Logger) error) error {
	var logger *slog.Logger
	switch format {
	case "text":
		logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	case "json":
		logger = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	default:
		return fmt.Errorf("unknown log format %q: want text or json", format)
	}
	ctrllog.SetLogger(logr.FromSlogHandler(logger.Handler()))
	cfg, err := restConfig(kubeconfig)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return run(ctx, cfg, logger)
}
