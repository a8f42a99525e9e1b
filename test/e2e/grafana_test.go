package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/require"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// The scrape jobs, named as in config/scm/prometheus-scrape-config.yaml (the dashboard's
// $agent and $listener default to these).
const (
	grafanaServicesJob = "crdipc"
	grafanaListenerJob = "crdipc-webhook-listener"
	grafanaAgentJob    = "crdipc-metrics-agent"
)

// TestGrafanaDashboard runs every query of config/grafana/scm-dashboard.json against a real
// Prometheus scraping `up`, after webhook traffic that gives every panel something to show:
// each query must return at least one sample that is a number (not NaN).
func TestGrafanaDashboard(t *testing.T) {
	require.Tool(t, "CRDIPC_REQUIRE_PROMETHEUS", "prometheus")
	queries := grafanaQueries(t, "../../config/grafana/scm-dashboard.json")
	if len(queries) == 0 {
		t.Fatal("the dashboard has no queries")
	}

	dataDir := t.TempDir()
	up := startUp(t, dataDir)
	printed := up.Output.String()
	webhookURL := regexp.MustCompile(`(?m)^\s*webhook\s+(http://(\S+)/webhook)\s+ops http://(\S+)/metrics`).FindStringSubmatch(printed)
	agentAddr := regexp.MustCompile(`(?m)^\s*scm\s+http://(\S+)/metrics`).FindStringSubmatch(printed)
	servicesAddr := regexp.MustCompile(`(?m)^\s*metrics\s+http://(\S+)/metrics`).FindStringSubmatch(printed)
	if webhookURL == nil || agentAddr == nil || servicesAddr == nil {
		t.Fatalf("up did not print the webhook, scm and metrics addresses:\n%s", printed)
	}
	targets := map[string]string{
		grafanaListenerJob: webhookURL[3], // the listener's /metrics, apart from /webhook
		grafanaAgentJob:    agentAddr[1],
	}
	if strings.HasSuffix(servicesAddr[1], ":0") {
		// Started with --metrics-addr 127.0.0.1:0, up must say which port it got.
		t.Errorf("up printed the services' metrics address as %s, not the port it listens on: cannot scrape it\n%s", servicesAddr[1], printed)
	} else {
		targets[grafanaServicesJob] = servicesAddr[1]
	}
	hook := newWebhookSender(t, up, dataDir)

	prom := testenv.StartPrometheus(t, targets)
	want := float64(len(targets))
	grafanaWaitFor(t, prom, 2*time.Minute, "every target scraped", map[string]float64{
		`count(up)`:      want,
		`count(up == 1)`: want,
	})

	// Two rounds of traffic, each seen by a scrape: rate() and increase() need a counter to
	// change between two samples, and a series appears only with its first increment.
	// Round 1: pull requests 42 (opened, synchronized) and 43 (closed), a branch created, a
	// ping, and a delivery with a wrong signature.
	hook.send(t, "pull_request", "pull_request-opened.json", "grafana-1", http.StatusOK)
	hook.send(t, "pull_request", "pull_request-synchronize.json", "grafana-2", http.StatusOK)
	hook.send(t, "pull_request", "pull_request-closed.json", "grafana-3", http.StatusOK)
	hook.send(t, "create", "create-branch.json", "grafana-4", http.StatusOK)
	hook.send(t, "ping", "ping.json", "grafana-5", http.StatusOK)
	hook.forged(t, "grafana-6")
	grafanaWaitFor(t, prom, time.Minute, "round 1 scraped", map[string]float64{
		`sum(crdipc_webhook_deliveries_total{job="` + grafanaListenerJob + `"})`: 6,
		`sum(crdipc_scm_events_total{job="` + grafanaAgentJob + `"})`:            4,
	})
	// Round 2: 42 merged, 43 reopened, a push to the branch, a redelivery, a forged delivery
	// again and a GET. The stat panels then show one open and one merged pull request and one
	// pushed branch.
	hook.send(t, "pull_request", "pull_request-closed-merged.json", "grafana-7", http.StatusOK)
	hook.send(t, "pull_request", "pull_request-reopened.json", "grafana-8", http.StatusOK)
	hook.send(t, "push", "push.json", "grafana-9", http.StatusOK)
	hook.send(t, "pull_request", "pull_request-opened.json", "grafana-1", http.StatusOK) // duplicate
	hook.forged(t, "grafana-10")
	hook.get(t, http.StatusMethodNotAllowed)
	grafanaWaitFor(t, prom, time.Minute, "round 2 scraped", map[string]float64{
		`sum(crdipc_webhook_deliveries_total{job="` + grafanaListenerJob + `"})`:     12,
		`sum(crdipc_scm_events_total{job="` + grafanaAgentJob + `"})`:                7,
		`sum(crdipc_scm_pullrequests{job="` + grafanaAgentJob + `",state="open"})`:   1,
		`sum(crdipc_scm_pullrequests{job="` + grafanaAgentJob + `",state="merged"})`: 1,
		`sum(crdipc_scm_branches{job="` + grafanaAgentJob + `",state="pushed"})`:     1,
	})

	for _, q := range queries {
		// Query answers one sample, so ask how many series the panel's expression returns,
		// and how many of them are numbers (NaN fails every comparison).
		count := fmt.Sprintf("count(%s)", q.expr)
		numbers := fmt.Sprintf("count((%s) >= -Inf)", q.expr)
		var n float64
		err := wait.Until(context.Background(), 30*time.Second, func(context.Context) (bool, error) {
			var err error
			if n, err = prom.Query(count); err != nil {
				return false, fmt.Errorf("%s: %w", count, err)
			}
			m, err := prom.Query(numbers)
			if err != nil {
				return false, fmt.Errorf("%s: %w", numbers, err)
			}
			if n < 1 || m < 1 {
				return false, fmt.Errorf("%v series, %v of them numbers", n, m)
			}
			return true, nil
		})
		if err != nil {
			t.Errorf("panel %q, query %s: no data: %v (dashboard expression %s)", q.panel, q.refID, err, q.raw)
			continue
		}
		t.Logf("panel %q, query %s: %v series (%s)", q.panel, q.refID, n, q.expr)
	}
}

// grafanaQuery is one target of a dashboard panel.
type grafanaQuery struct {
	panel, refID string
	// raw is the expression as written, expr with the template variables substituted.
	raw, expr string
}

type grafanaPanel struct {
	Title   string `json:"title"`
	Type    string `json:"type"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []grafanaPanel `json:"panels"` // a row's panels (collapsed rows keep them here)
}

// grafanaQueries reads a dashboard and returns every panel's query, in rows too, with the
// template variables substituted as Grafana would for the dashboard's defaults.
func grafanaQueries(t *testing.T, path string) []grafanaQuery {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Time struct {
			From string `json:"from"`
		} `json:"time"`
		Templating struct {
			List []struct {
				Name    string `json:"name"`
				Type    string `json:"type"`
				Query   any    `json:"query"`
				Current struct {
					Value any `json:"value"`
				} `json:"current"`
			} `json:"list"`
		} `json:"templating"`
		Panels []grafanaPanel `json:"panels"`
		Rows   []grafanaPanel `json:"rows"` // dashboards before schema 16
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}

	// Grafana's built-in variables, for the dashboard's time range and a datasource with
	// Grafana's default scrape interval of 15 s: $__interval is the step of a graph about
	// 1,000 points wide, $__rate_interval = max($__interval + scrape interval, 4 × scrape interval).
	rng := 6 * time.Hour
	if r, ok := strings.CutPrefix(d.Time.From, "now-"); ok {
		if dur, err := time.ParseDuration(r); err == nil {
			rng = dur
		}
	}
	interval := max(rng/1000, time.Second).Round(time.Second)
	scrape := 15 * time.Second
	vars := map[string]string{
		"__interval":      promDuration(interval),
		"__interval_ms":   fmt.Sprint(interval.Milliseconds()),
		"__rate_interval": promDuration(max(interval+scrape, 4*scrape)),
		"__range":         promDuration(rng),
		"__range_s":       fmt.Sprint(int64(rng.Seconds())),
		"__range_ms":      fmt.Sprint(rng.Milliseconds()),
	}
	for _, v := range d.Templating.List {
		if v.Type == "datasource" {
			continue
		}
		var value string
		switch cur := v.Current.Value.(type) {
		case string:
			value = cur
		case []any: // multi-value: Grafana substitutes (a|b)
			var vs []string
			for _, x := range cur {
				vs = append(vs, regexp.QuoteMeta(fmt.Sprint(x)))
			}
			value = "(" + strings.Join(vs, "|") + ")"
		}
		if value == "" || value == "$__all" {
			// No saved selection: a custom variable's first option.
			if q, ok := v.Query.(string); ok && v.Type == "custom" {
				value = strings.TrimSpace(strings.Split(q, ",")[0])
			}
		}
		if value == "" {
			t.Fatalf("%s: no value for template variable $%s", path, v.Name)
		}
		vars[v.Name] = value
	}

	// $name, ${name}, ${name:format} and the deprecated [[name]].
	ref := regexp.MustCompile(`\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)`)
	var out []grafanaQuery
	var walk func(ps []grafanaPanel)
	walk = func(ps []grafanaPanel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q, query %s: empty expression", p.Title, tg.RefID)
					continue
				}
				expr := ref.ReplaceAllStringFunc(tg.Expr, func(m string) string {
					s := ref.FindStringSubmatch(m)
					name := s[1] + s[2] + s[3]
					if v, ok := vars[name]; ok {
						return v
					}
					t.Errorf("panel %q, query %s: unknown template variable %s in %s", p.Title, tg.RefID, m, tg.Expr)
					return m
				})
				out = append(out, grafanaQuery{panel: p.Title, refID: tg.RefID, raw: tg.Expr, expr: expr})
			}
			if len(p.Targets) == 0 && p.Type != "row" && p.Type != "text" {
				t.Errorf("panel %q (%s) has no query", p.Title, p.Type)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	walk(d.Rows)
	return out
}

// promDuration writes d as a PromQL duration: 60s → 1m, 6h → 6h.
func promDuration(d time.Duration) string {
	for _, u := range []struct {
		unit string
		d    time.Duration
	}{{"h", time.Hour}, {"m", time.Minute}} {
		if d%u.d == 0 {
			return fmt.Sprintf("%d%s", d/u.d, u.unit)
		}
	}
	return fmt.Sprintf("%ds", int64(math.Round(d.Seconds())))
}

// grafanaWaitFor polls until every query answers its value.
func grafanaWaitFor(t *testing.T, prom *testenv.Prometheus, timeout time.Duration, what string, want map[string]float64) {
	t.Helper()
	testenv.Eventually(t, timeout, what, func(context.Context) (bool, error) {
		var wrong strings.Builder
		for q, w := range want {
			if v, err := prom.Query(q); err != nil {
				fmt.Fprintf(&wrong, "\n  %s: %v, want %v", q, err, w)
			} else if v != w {
				fmt.Fprintf(&wrong, "\n  %s = %v, want %v", q, v, w)
			}
		}
		if wrong.Len() > 0 {
			return false, errors.New(wrong.String())
		}
		return true, nil
	})
}
