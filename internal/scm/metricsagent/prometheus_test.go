package metricsagent_test

import (
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv"
)

// TestPrometheusEndToEnd runs a real Prometheus server (Debian's prometheus package) that
// scrapes the metrics agent and the webhook listener, sends GitHub deliveries through the
// listener, and asks Prometheus with PromQL for the counts.
func TestPrometheusEndToEnd(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	s := newSender(t, env.Config, ns)
	agent := startAgent(t, nil, ns)

	prom := testenv.StartPrometheus(t, map[string]string{
		"crdipc-metrics-agent":    strings.TrimPrefix(agent.URL, "http://"),
		"crdipc-webhook-listener": strings.TrimPrefix(s.ops.URL, "http://"),
	})

	s.send("pull_request", pullRequest(t, 1, "opened", "open", false, 1))
	s.send("pull_request", pullRequest(t, 2, "opened", "open", false, 2))
	s.send("pull_request", pullRequest(t, 3, "opened", "open", false, 3))
	s.send("pull_request", pullRequest(t, 1, "closed", "closed", true, 4))
	s.send("push", push(t, "feature-a", 1, true, false))
	s.send("push", push(t, "feature-a", 2, false, false))
	s.send("push", push(t, "feature-b", 3, false, true))
	// A redelivery: no new Event, so nothing new to count.
	s.seq--
	s.send("push", push(t, "feature-b", 3, false, true))

	for query, want := range map[string]float64{
		`up{job="crdipc-metrics-agent"}`:                                              1,
		`sum(crdipc_scm_events_total)`:                                                7,
		`sum(crdipc_scm_events_total{kind="PullRequest",reason="PullRequestOpened"})`: 3,
		`sum(crdipc_scm_events_total{reason="PullRequestMerged"})`:                    1,
		`sum(crdipc_scm_events_total{kind="Branch"})`:                                 3,
		`crdipc_scm_pullrequests{state="open"}`:                                       2,
		`crdipc_scm_pullrequests{state="merged"}`:                                     1,
		`crdipc_scm_branches{state="pushed"}`:                                         1,
		`crdipc_scm_branches{state="deleted"}`:                                        1,
		`sum(crdipc_webhook_deliveries_total{result="duplicate"})`:                    1,
		`sum(crdipc_webhook_deliveries_total)`:                                        8,
	} {
		prom.WaitFor(t, time.Minute, query, want)
	}
}
