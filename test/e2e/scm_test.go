package e2e

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv"
)

// TestSCMPipeline sends signed GitHub deliveries to the listener `up` runs,
// redelivers one, and has a real Prometheus scrape the metrics agent.
func TestSCMPipeline(t *testing.T) {
	dataDir := t.TempDir()
	up := startUp(t, dataDir)
	webhookURL := regexp.MustCompile(`webhook\s+(http://\S+/webhook)`).FindStringSubmatch(up.Output.String())
	metricsURL := regexp.MustCompile(`scm\s+http://(\S+)/metrics`).FindStringSubmatch(up.Output.String())
	if webhookURL == nil || metricsURL == nil {
		t.Fatalf("up did not print the webhook and metrics addresses:\n%s", up.Output.String())
	}
	// The port GitHub reaches serves /webhook alone: the listener's metrics and probes are on
	// a port of their own.
	if r, err := http.Get(strings.TrimSuffix(webhookURL[1], "/webhook") + "/metrics"); err != nil || r.StatusCode != http.StatusNotFound {
		t.Errorf("/metrics on the webhook port: %v %v, want 404", r, err)
	}
	hook := newWebhookSender(t, up, dataDir)
	for range 3 { // a delivery and two redeliveries: 2xx each
		hook.send(t, "pull_request", "pull_request-opened.json", "72d3162e-cc78-11e3-81ab-4c9367dc0958", http.StatusOK)
	}
	if prs := strings.Fields(up.Kubectl(t, "get", "pullrequests", "-o", "name")); len(prs) != 1 {
		t.Fatalf("pull requests after one delivery and two redeliveries: %v", prs)
	}
	events := strings.Fields(up.Kubectl(t, "get", "events", "--field-selector", "involvedObject.kind=PullRequest", "-o", "name"))
	if len(events) != 1 {
		t.Fatalf("Events after one delivery and two redeliveries: %v", events)
	}

	prom := testenv.StartPrometheus(t, map[string]string{"crdipc-metrics-agent": metricsURL[1]})
	for query, want := range map[string]float64{
		`sum(crdipc_scm_events_total{kind="PullRequest"})`: 1,
		`crdipc_scm_pullrequests{state="open"}`:            1,
	} {
		prom.WaitFor(t, time.Minute, query, want)
	}
}
