package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/crdipc/crdipc/internal/bench"
)

func newBenchWebhookCommand() *cobra.Command {
	var target benchTarget
	o := bench.DefaultWebhookOptions
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Measure the GitHub webhook listener: deliveries/s and latency against the floor",
		Long: `webhook runs the webhook listener in this process on loopback and sends it
signed pull_request deliveries, each for a new pull request, so each costs three
writes: the PullRequest, its Event, and its Delivery record, created complete:

  deliveries/s   with --clients concurrent HTTP clients, as a ratio to the
                 ceiling: the floor's creates/s with as many writers, divided
                 by three (goal ≥ 0.8)
  latency        p50/p99 at --rate deliveries/s, from each delivery's scheduled
                 send time, as a ratio to the same three writes sent straight to
                 the API server at the same rate (goal: p99 ≤ 1.5×)
  API requests   what one delivery costs the API server, counted by its
                 apiserver_request_total over the throughput run: writes and
                 round trips by verb and resource

Every goal is printed with its figure and "met" or "missed".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The listener's controller-runtime client logs nothing worth a benchmark's output.
			ctrllog.SetLogger(logr.Discard())
			return runBench(cmd, &target, func(ctx context.Context, cfg *rest.Config) (*bench.Webhook, error) {
				o.InProcess = target.kubeconfig == ""
				return bench.MeasureWebhook(ctx, cfg, o)
			}, printWebhook)
		},
	}
	target.flags(cmd)
	cmd.Flags().IntVar(&o.Clients, "clients", o.Clients, "concurrent HTTP clients in the throughput run")
	cmd.Flags().IntVar(&o.Deliveries, "deliveries", o.Deliveries, "deliveries in the throughput run")
	cmd.Flags().Float64Var(&o.Rate, "rate", o.Rate, "deliveries per second in the latency run")
	cmd.Flags().IntVar(&o.Samples, "samples", o.Samples, "deliveries a side (listener, floor) in the latency run: its p99 is the samples/100th slowest")
	return cmd
}

func printWebhook(out io.Writer, w *bench.Webhook) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "webhook\tvalue\tfloor\tratio\t")
	fmt.Fprintf(tw, "deliveries/s, %d clients\t%.0f\t%.0f\t%.2f\t\n", w.Options.Clients, w.DeliveriesPerSec, w.CeilingDeliveriesPerSec, w.ThroughputRatio)
	fmt.Fprintf(tw, "p50 at %.0f/s (ms)\t%.2f\t%.2f\t%.2f\t\n", w.Options.Rate, w.Latency.P50, w.FloorLatency.P50, w.P50Ratio)
	fmt.Fprintf(tw, "p99 at %.0f/s (ms)\t%.2f\t%.2f\t%.2f\t\n", w.Options.Rate, w.Latency.P99, w.FloorLatency.P99, w.P99Ratio)
	tw.Flush()
	fmt.Fprintf(out, "(floor deliveries/s = API creates/s with %d writers (%.0f) / %d writes per delivery)\n",
		w.Options.Clients, w.FloorCreatesPerSec, bench.WebhookWritesPerDelivery)
	fmt.Fprintln(out)
	printGoals(out, w.Goals(), false)
	printAPIRequests(out, "delivery", w.APIRequests)
}
