package metricsagent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/internal/scm/delivery"
	"github.com/crdipc/crdipc/internal/scm/metricsagent"
	"github.com/crdipc/crdipc/internal/scm/webhook"
	"github.com/crdipc/crdipc/internal/services"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/metrics"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

const secret = "metrics-agent-test-secret"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// runningAgent is an agent serving on a loopback port.
type runningAgent struct {
	*metricsagent.Agent
	URL  string
	stop func()
}

// startAgent runs an agent for ns until the test ends or stop is called, and returns once
// its caches are synced.
func startAgent(t *testing.T, cfg *rest.Config, ns string) *runningAgent {
	t.Helper()
	return startAgentWith(t, ns, metricsagent.Options{Config: cfg})
}

// agentConfig acts as the agent's own ServiceAccount with its shipped role, bound in the
// namespace it watches (where its checkpoint is too).
func agentConfig(t *testing.T, ns string) *rest.Config {
	t.Helper()
	return testenv.Get(t).AsServiceAccount(t, "metrics-agent", ns)
}

// startAgentWith is startAgent with options (Config nil: agentConfig); stop returns once
// the agent has written its last checkpoint.
func startAgentWith(t *testing.T, ns string, o metricsagent.Options) *runningAgent {
	t.Helper()
	r := serveAgent(t, ns, o)
	testenv.Eventually(t, 30*time.Second, "agent ready", wait.HTTPOK(r.URL+"/readyz"))
	return r
}

// serveAgent is startAgentWith without waiting for the agent to be ready.
func serveAgent(t *testing.T, ns string, o metricsagent.Options) *runningAgent {
	t.Helper()
	if o.Config == nil {
		o.Config = agentConfig(t, ns)
	}
	o.Namespace, o.Logger = ns, quiet
	a, err := metricsagent.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// Served as crdipc serves it: /healthz at once, /readyz once Start has synced.
	go func() {
		done <- (&services.HTTPServer{Name: "metrics agent", Listener: ln, Handler: a.Handler()}).Start(ctx)
	}()
	go func() {
		if err := a.Start(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("agent: %v", err)
		}
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent: %v", err)
			}
			select {
			case <-a.Stopped():
			case <-time.After(30 * time.Second):
				t.Errorf("agent did not stop within 30s of its context ending")
			}
		})
	}
	t.Cleanup(stop)
	return &runningAgent{Agent: a, URL: "http://" + ln.Addr().String(), stop: stop}
}

// metrics scrapes the agent's /metrics.
func (r *runningAgent) metrics(t testing.TB) metrics.Families {
	t.Helper()
	return metrics.Scrape(t, r.URL+"/metrics")
}

func eventsTotal(t *testing.T, a *runningAgent) float64 {
	t.Helper()
	return a.metrics(t).Sum("crdipc_scm_events_total", nil)
}

// eventSeries is every series of crdipc_scm_events_total, by "kind/reason/type".
func eventSeries(t *testing.T, a *runningAgent) map[string]float64 {
	t.Helper()
	m := map[string]float64{}
	for _, s := range a.metrics(t)["crdipc_scm_events_total"].GetMetric() {
		l := map[string]string{}
		for _, p := range s.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		m[l["kind"]+"/"+l["reason"]+"/"+l["type"]] = s.GetCounter().GetValue()
	}
	return m
}

// checkpoint is the agent's checkpoint ConfigMap in ns as stored: its holder and the sum of
// its totals (-1 if it holds no state yet).
func checkpoint(t *testing.T, ns string) (holder string, total float64) {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := testenv.Get(t).Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: metricsagent.DefaultCheckpointName}, cm); err != nil {
		t.Fatalf("reading the checkpoint: %v", err)
	}
	raw, ok := cm.Data["totals"]
	if !ok {
		return cm.Data["holder"], -1
	}
	var totals []struct{ Count float64 }
	if err := json.Unmarshal([]byte(raw), &totals); err != nil {
		t.Fatalf("checkpoint totals %q: %v", raw, err)
	}
	for _, e := range totals {
		total += e.Count
	}
	return cm.Data["holder"], total
}

// waitTotal waits until the agent's counter is exactly n. Reaching n and staying is checked
// by callers with a sentinel: one more Event must make it n+1, not more.
func waitTotal(t *testing.T, a *runningAgent, n float64) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("crdipc_scm_events_total == %v", n), func(context.Context) (bool, error) {
		got := eventsTotal(t, a)
		if got > n {
			t.Fatalf("crdipc_scm_events_total is %v, over the expected %v", got, n)
		}
		if got < n {
			return false, fmt.Errorf("crdipc_scm_events_total is %v", got)
		}
		return true, nil
	})
}

// sender delivers signed GitHub payloads to a real webhook listener, so the Events the agent
// counts are the ones the pipeline writes.
type sender struct {
	t   testing.TB
	srv *httptest.Server
	// ops serves the listener's /metrics, apart from /webhook, as it runs.
	ops *httptest.Server
	seq int
	mu  sync.Mutex
}

func newSender(t testing.TB, cfg *rest.Config, ns string) *sender {
	l, err := webhook.New(webhook.Options{Config: cfg, Namespace: ns, Secret: []byte(secret), Logger: quiet, Instance: "test"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(l.Handler())
	t.Cleanup(srv.Close)
	ops := httptest.NewServer(l.OpsHandler())
	t.Cleanup(ops.Close)
	return &sender{t: t, srv: srv, ops: ops}
}

func (s *sender) nextDelivery() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return fmt.Sprintf("00000000-0000-4000-8000-%012d", s.seq)
}

// send delivers one event and returns the listener's result; it fails the test unless 2xx.
func (s *sender) send(event string, payload []byte) string {
	s.t.Helper()
	req, err := delivery.New(context.Background(), s.srv.URL+"/webhook", []byte(secret), event, s.nextDelivery(), payload)
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := s.srv.Client().Do(req)
	if err != nil {
		s.t.Fatalf("deliver: %v", err)
	}
	defer resp.Body.Close()
	var body struct{ Result, Error string }
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode/100 != 2 {
		s.t.Fatalf("deliver %s: %d %s", event, resp.StatusCode, body.Error)
	}
	return body.Result
}

var base = time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)

// pullRequest is the webhook fixture for PR 42 rewritten as pull request number in the given
// action and state, updated at base+minute.
func pullRequest(t testing.TB, number int, action, state string, merged bool, minute int) []byte {
	t.Helper()
	raw, err := os.ReadFile("../webhook/testdata/pull_request-opened.json")
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatal(err)
	}
	pr := p["pull_request"].(map[string]any)
	p["action"], p["number"] = action, number
	pr["number"], pr["id"], pr["state"], pr["merged"] = number, 1000000+number, state, merged
	pr["updated_at"] = base.Add(time.Duration(minute) * time.Minute).Format(time.RFC3339)
	out, _ := json.Marshal(p)
	return out
}

// push is a push of branch to a new head at base+minute.
func push(t testing.TB, branch string, minute int, created, deleted bool) []byte {
	t.Helper()
	raw, err := os.ReadFile("../webhook/testdata/push.json")
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]any
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatal(err)
	}
	p["ref"], p["created"], p["deleted"] = "refs/heads/"+branch, created, deleted
	if deleted {
		p["after"] = "0000000000000000000000000000000000000000"
	}
	p["repository"].(map[string]any)["pushed_at"] = base.Add(time.Duration(minute) * time.Minute).Unix()
	out, _ := json.Marshal(p)
	return out
}

// watchBreaker ends the Event watches in flight and answers the next watch request with
// 410 Gone "too old resource version", which is what the API server answers when a watch
// resumes from a resourceVersion no longer in its window. client-go then lists afresh: the
// re-list that seed 003's agent counted twice.
type watchBreaker struct {
	mu     sync.Mutex
	gone   int
	bodies map[io.ReadCloser]bool
}

const goneStatus = `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1 (2)","reason":"Expired","code":410}`

func (b *watchBreaker) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		isEventWatch := req.URL.Query().Get("watch") == "true" && strings.HasSuffix(req.URL.Path, "/events")
		if !isEventWatch {
			return rt.RoundTrip(req)
		}
		b.mu.Lock()
		if b.gone > 0 {
			b.gone--
			b.mu.Unlock()
			return &http.Response{
				StatusCode: http.StatusGone, Status: "410 Gone", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
				Header:  http.Header{"Content-Type": []string{"application/json"}},
				Body:    io.NopCloser(strings.NewReader(goneStatus)),
				Request: req,
			}, nil
		}
		b.mu.Unlock()
		resp, err := rt.RoundTrip(req)
		if err == nil {
			b.mu.Lock()
			if b.bodies == nil {
				b.bodies = map[io.ReadCloser]bool{}
			}
			b.bodies[resp.Body] = true
			b.mu.Unlock()
		}
		return resp, err
	})
}

// expire ends the current watches and fails the next one with 410.
func (b *watchBreaker) expire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gone = 1
	for body := range b.bodies {
		body.Close()
	}
	clear(b.bodies)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
