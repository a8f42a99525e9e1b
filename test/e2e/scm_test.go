package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/crdipc/crdipc/internal/testenv"
)

// TestSCMPipeline sends signed GitHub deliveries to the listener `up` runs,
// redelivers one, and has a real Prometheus scrape the metrics agent.
func TestSCMPipeline(t *testing.T) {
	dataDir := t.TempDir()
	up := startUp(t, dataDir)
	webhookURL := regexp.MustCompile(`webhook\s+(http://\S+/webhook)`).FindStringSubmatch(up.output.String())
	metricsURL := regexp.MustCompile(`scm\s+http://(\S+)/metrics`).FindStringSubmatch(up.output.String())
	if webhookURL == nil || metricsURL == nil {
		t.Fatalf("up did not print the webhook and metrics addresses:\n%s", up.output.String())
	}
	secret, err := os.ReadFile(filepath.Join(dataDir, "webhook-secret"))
	if err != nil {
		t.Fatalf("up did not write the webhook secret: %v", err)
	}
	body, err := os.ReadFile("../../internal/scm/webhook/testdata/pull_request-opened.json")
	if err != nil {
		t.Fatal(err)
	}
	send := func(delivery string) int {
		mac := hmac.New(sha256.New, bytes.TrimSpace(secret))
		mac.Write(body)
		req, err := http.NewRequest(http.MethodPost, webhookURL[1], bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-GitHub-Event", "pull_request")
		req.Header.Set("X-GitHub-Delivery", delivery)
		req.Header.Set("X-Hub-Signature-256", "sha256="+hex.EncodeToString(mac.Sum(nil)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for range 3 { // a delivery and two redeliveries
		if code := send("72d3162e-cc78-11e3-81ab-4c9367dc0958"); code/100 != 2 {
			t.Fatalf("delivery answered %d", code)
		}
	}
	if prs := strings.Fields(up.kubectl(t, "get", "pullrequests", "-o", "name")); len(prs) != 1 {
		t.Fatalf("pull requests after one delivery and two redeliveries: %v", prs)
	}
	events := strings.Fields(up.kubectl(t, "get", "events", "--field-selector", "involvedObject.kind=PullRequest", "-o", "name"))
	if len(events) != 1 {
		t.Fatalf("Events after one delivery and two redeliveries: %v", events)
	}

	prom := testenv.StartPrometheus(t, map[string]string{"crdipc-metrics-agent": metricsURL[1]})
	for query, want := range map[string]float64{
		`sum(crdipc_scm_events_total{kind="PullRequest"})`: 1,
		`crdipc_scm_pullrequests{state="open"}`:            1,
	} {
		var got float64
		var qerr error
		if err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			got, qerr = prom.Query(query)
			return qerr == nil && got == want, nil
		}); err != nil {
			t.Errorf("PromQL %s = %v (%v), want %v", query, got, qerr, want)
		}
	}
}
