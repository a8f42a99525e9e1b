package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/require"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// Prometheus is a real Prometheus server (Debian's package) scraping the
// given targets every second, for end-to-end checks of /metrics endpoints.
type Prometheus struct{ url string }

// StartPrometheus runs a Prometheus server on loopback that scrapes targets
// (job name → host:port) every second, until the test ends. Without a
// prometheus binary on PATH the test is skipped, or fails when
// CRDIPC_REQUIRE_PROMETHEUS=1 (as CI sets).
func StartPrometheus(t testing.TB, targets map[string]string) *Prometheus {
	t.Helper()
	bin := require.Tool(t, "CRDIPC_REQUIRE_PROMETHEUS", "prometheus")
	dir := t.TempDir()
	var cfg strings.Builder
	cfg.WriteString("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n")
	for job, target := range targets {
		fmt.Fprintf(&cfg, "  - job_name: %s\n    static_configs:\n      - targets: [%q]\n", job, target)
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin,
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting prometheus: %v", err)
	}
	// exited is closed, not sent on, so both the readiness wait and the cleanup see it.
	exited := make(chan struct{})
	var exitErr error
	go func() { exitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("prometheus log:\n%s", b)
			}
		}
		logf.Close()
	})
	p := &Prometheus{url: "http://" + addr}
	wait.Eventually(t, 30*time.Second, "prometheus ready", func(ctx context.Context) (bool, error) {
		select {
		case <-exited:
			t.Fatalf("prometheus exited: %v", exitErr) // the cleanup shows its log
		default:
		}
		return wait.HTTPOK(p.url + "/-/ready")(ctx)
	})
	return p
}

// Query runs an instant PromQL query that must return one sample.
func (p *Prometheus) Query(q string) (float64, error) {
	resp, err := http.Get(p.url + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, fmt.Errorf("decoding answer: %w", err)
	}
	if body.Status != "success" {
		return 0, fmt.Errorf("query failed: %s", body.Error)
	}
	if n := len(body.Data.Result); n != 1 {
		return 0, fmt.Errorf("%d samples", n)
	}
	v, ok := body.Data.Result[0].Value[1].(string)
	if !ok {
		return 0, fmt.Errorf("sample value %v is not a string", body.Data.Result[0].Value[1])
	}
	return strconv.ParseFloat(v, 64)
}

// WaitFor waits until the PromQL query returns want: Prometheus scrapes every second, so a
// count takes a scrape or two to show.
func (p *Prometheus) WaitFor(t testing.TB, timeout time.Duration, query string, want float64) {
	t.Helper()
	wait.Eventually(t, timeout, fmt.Sprintf("PromQL %s = %v", query, want), func(context.Context) (bool, error) {
		got, err := p.Query(query)
		if err != nil {
			return false, err
		}
		if got != want {
			return false, fmt.Errorf("got %v", got)
		}
		return true, nil
	})
}
