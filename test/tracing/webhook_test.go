package tracing

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"
	"sigs.k8s.io/controller-runtime/pkg/client"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
	"github.com/crdipc/crdipc/internal/scm/delivery"
	"github.com/crdipc/crdipc/internal/scm/metricsagent"
	"github.com/crdipc/crdipc/internal/scm/webhook"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/tracing"
)

const (
	listenerService = "webhook-listener"
	agentMetrics    = "metrics-agent"
)

// TestWebhookDeliveryIsOneTrace: a signed GitHub delivery is one trace, from the listener's
// span of the delivery through kube-apiserver's spans of its writes to the metrics agent's
// span of counting the delivery's Event. Both services act as their ServiceAccounts.
func TestWebhookDeliveryIsOneTrace(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	secret := []byte("traced-deliveries")
	l, err := webhook.New(webhook.Options{
		Config:    provider.RESTConfig(env.WithToken(t, env.AsServiceAccount(t, listenerService, ns)), listenerService),
		Namespace: ns, Secret: secret, Logger: quiet,
		TracerProvider: provider.Service(listenerService),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Start(ctx); err != nil {
		t.Fatalf("starting listener: %v", err)
	}
	srv := httptest.NewServer(l.Handler())
	t.Cleanup(srv.Close)

	agent, err := metricsagent.New(metricsagent.Options{
		Config:    provider.RESTConfig(env.WithToken(t, env.AsServiceAccount(t, agentMetrics, ns)), agentMetrics),
		Namespace: ns, Logger: quiet,
		TracerProvider: provider.Service(agentMetrics),
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := agent.Start(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("metrics agent: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-agent.Stopped()
	})
	testenv.Eventually(t, 30*time.Second, "the metrics agent synced", func(context.Context) (bool, error) {
		return agent.HasSynced(), nil
	})

	body, err := os.ReadFile("../../internal/scm/webhook/testdata/pull_request-opened.json")
	if err != nil {
		t.Fatal(err)
	}
	req, err := delivery.New(context.Background(), srv.URL+"/webhook", secret, "pull_request", "6f1c8a5e-traced", body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("delivery: %s: %s", resp.Status, answer)
	}

	// The pull request the delivery created carries the delivery's span.
	var prs scmv1alpha1.PullRequestList
	if err := env.Client.List(ctx, &prs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(prs.Items) != 1 {
		t.Fatalf("%d pull requests after the delivery, want 1 (answer %s)", len(prs.Items), answer)
	}
	delivery := traceparentOf(t, &prs.Items[0])

	tr := waitTrace(t, delivery.TraceID(), "the listener's, kube-apiserver's and the metrics agent's spans in the delivery's trace", func(tr traceSpans) error {
		d, ok := find(tr.all, listenerService, "delivery pull_request")
		if !ok {
			return errors.New("no delivery span from the listener")
		}
		if d.SpanID != delivery.SpanID() || d.Parent.IsValid() || d.Kind != ptrace.SpanKindServer {
			return fmt.Errorf("delivery span %s: want the root server span the pull request names (%s)", d, delivery.SpanID())
		}
		for _, resource := range []string{"pullrequests", "events", "deliveries"} {
			if _, ok := findFunc(tr.all, func(s span) bool {
				return s.Service == tracing.APIServerService && strings.HasPrefix(s.Name, "POST ") && strings.Contains(s.Name, "/"+resource) && tr.under(s, d.SpanID)
			}); !ok {
				return fmt.Errorf("no kube-apiserver span of the listener's create of %s under the delivery span", resource)
			}
		}
		counted := tr.of(agentMetrics, "count Event")
		if len(counted) == 0 {
			return errors.New("no count span from the metrics agent")
		}
		for _, c := range counted {
			if c.Parent != d.SpanID || c.Attributes["scm.reason"] != "PullRequestOpened" {
				return fmt.Errorf("count span %s %v: want the PullRequestOpened Event's, a child of the delivery span", c, c.Attributes)
			}
		}
		return nil
	})
	tr.log(t)
}
