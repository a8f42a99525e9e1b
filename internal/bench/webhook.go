package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/scm/delivery"
	"github.com/crdipc/crdipc/internal/scm/webhook"
	"github.com/crdipc/crdipc/internal/services"
)

// WebhookOptions size the webhook benchmark.
type WebhookOptions struct {
	// Clients is how many concurrent HTTP clients send deliveries in the throughput run.
	Clients int
	// Deliveries is how many deliveries the throughput run sends.
	Deliveries int
	// Rate is the paced delivery rate (per second) of the latency run.
	Rate float64
	// Samples is how many deliveries the latency run sends.
	Samples int
	// InProcess says the API server runs in this process (the embedded control plane):
	// its request counter is read from this process's registry, not from its /metrics.
	InProcess bool `json:"-"`
}

// DefaultWebhookOptions take about a minute and a half on a 2-core machine, control plane
// start included. The latency run is 3000 deliveries a side (30 s at 100/s): its p99 is
// then the 30th slowest, where with 500 it was the 5th, which one stall of the shared
// machine decided.
var DefaultWebhookOptions = WebhookOptions{Clients: 16, Deliveries: 2000, Rate: 100, Samples: 3000}

// Webhook is the result of `crdipc bench webhook`. Every delivery is a pull_request opened
// for a new pull request: the listener creates the object and its Event, and records the body
// (a Delivery, created complete): three writes, so the ceiling is the API server's create
// rate divided by three.
type Webhook struct {
	Options WebhookOptions `json:"options"`
	// FloorCreatesPerSec is the API server's create rate with Clients writers (bench floor).
	FloorCreatesPerSec float64 `json:"floorCreatesPerSec"`
	// CeilingDeliveriesPerSec is FloorCreatesPerSec / WebhookWritesPerDelivery.
	CeilingDeliveriesPerSec float64 `json:"ceilingDeliveriesPerSec"`
	// DeliveriesPerSec is what the listener sustained with Clients signed HTTP clients.
	DeliveriesPerSec float64 `json:"deliveriesPerSec"`
	// ThroughputRatio is DeliveriesPerSec / CeilingDeliveriesPerSec (goal ≥ 0.8).
	ThroughputRatio float64 `json:"throughputRatio"`
	// Latency is request start → 2xx at Rate deliveries/s, measured from each delivery's
	// scheduled send time so a stall is not hidden (goal p99 < 50 ms at 100/s).
	Latency Latencies `json:"latency"`
	// FloorLatency is the same three writes (PullRequest, Event, Delivery) sent directly to
	// the API server at the same rate: the least a delivery can cost.
	FloorLatency Latencies `json:"floorLatency"`
	// P50Ratio and P99Ratio are Latency over FloorLatency.
	P50Ratio float64 `json:"p50Ratio"`
	P99Ratio float64 `json:"p99Ratio"`
	// APIRequests are what one delivery costs the API server, counted over the throughput
	// run (the listener alone loads it then).
	APIRequests *APIRequests `json:"apiRequestsPerDelivery,omitempty"`
}

// webhookPath is what a delivery touches: its record, the pull request, their Events.
var webhookPath = pathOf(scmv1alpha1.GroupVersion.Group)

// MeasureWebhook runs an in-process webhook listener against cfg and measures it against
// the same run's floor. cfg must allow unthrottled clients (QPS < 0).
func MeasureWebhook(ctx context.Context, cfg *rest.Config, o WebhookOptions) (*Webhook, error) {
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	res := &Webhook{Options: o}

	ns, cleanup, err := tempNamespace(ctx, c, "bench-webhook-")
	if err != nil {
		return nil, err
	}
	defer cleanup()

	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, err
	}
	l, err := webhook.New(webhook.Options{Config: cfg, Namespace: ns, Secret: secret,
		// Every delivery is served, none refused as overload: the throughput run has Clients
		// in flight, the paced latency run (open loop) Rate × its latency, so a stall of the
		// shared machine of up to 10 s there is measured as latency, not failed as a 503.
		MaxConcurrentRequests: max(o.Clients, int(o.Rate*10), webhook.DefaultMaxConcurrentRequests),
		Logger:                slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	sctx, stop := context.WithCancel(ctx)
	// The listener as crdipc runs it: its cache synced, then served by services.HTTPServer.
	if err := l.Start(sctx); err != nil {
		stop()
		ln.Close()
		return nil, err
	}
	served := make(chan error, 1)
	go func() {
		served <- (&services.HTTPServer{Name: "webhook listener", Listener: ln, Handler: l.Handler()}).Start(sctx)
	}()
	defer func() { stop(); <-served }()
	url := "http://" + ln.Addr().String() + "/webhook"

	var seq atomic.Int64
	send := func(hc *http.Client) error {
		n := seq.Add(1)
		body := prPayload(n)
		req, err := delivery.New(ctx, url, secret, "pull_request", fmt.Sprintf("bench-%d", n), body)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		msg, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("delivery %d: %s: %s", n, resp.Status, msg)
		}
		return nil
	}
	newHTTPClient := func() *http.Client {
		return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 30 * time.Second}
	}

	// Warm up: the first request pays for API discovery in the listener's client.
	if err := send(newHTTPClient()); err != nil {
		return nil, err
	}

	// Latency first, floor then listener, on a quiet API server: the throughput runs leave
	// thousands of objects whose namespace deletion would load the server for a while.
	var pair atomic.Int64
	// Warm-up, discarded: a control plane that just started is still settling (caches,
	// controllers, etcd's first compactions) and would put its own stalls into the floor.
	if _, err := paced(ctx, o.Rate, min(o.Samples/2, 500), func() error { return createPair(ctx, c, ns, pair.Add(1)) }); err != nil {
		return nil, err
	}
	// Floor and listener take turns in rounds, so that a stall of the shared machine (etcd
	// fsync, GC of the embedded API server) lands in both rather than in whichever ran then;
	// which goes first alternates, so that neither always inherits what the other left the
	// API server to do (watch fan-out, etcd's compaction).
	const rounds = 6
	var floorD, listenerD []time.Duration
	hc := newHTTPClient()
	for r := range rounds {
		n := o.Samples / rounds
		if r == rounds-1 {
			n = o.Samples - n*(rounds-1)
		}
		floor := func() error {
			d, err := paced(ctx, o.Rate, n, func() error { return createPair(ctx, c, ns, pair.Add(1)) })
			floorD = append(floorD, d...)
			return err
		}
		listener := func() error {
			d, err := paced(ctx, o.Rate, n, func() error { return send(hc) })
			listenerD = append(listenerD, d...)
			return err
		}
		first, second := floor, listener
		if r%2 == 1 {
			first, second = listener, floor
		}
		if err := first(); err != nil {
			return nil, err
		}
		if err := second(); err != nil {
			return nil, err
		}
	}
	res.FloorLatency, res.Latency = summarize(floorD), summarize(listenerD)
	res.P50Ratio = res.Latency.P50 / res.FloorLatency.P50
	res.P99Ratio = res.Latency.P99 / res.FloorLatency.P99

	counter, err := newRequestCounter(cfg, o.InProcess)
	if err != nil {
		return nil, err
	}
	if res.APIRequests, err = countRequests(ctx, counter, webhookPath, fmt.Sprintf("%d deliveries, %d clients", o.Deliveries, o.Clients), o.Deliveries, func() (err error) {
		res.DeliveriesPerSec, err = concurrently(o.Clients, o.Deliveries, func() func() error {
			hc := newHTTPClient()
			return func() error { return send(hc) }
		})
		return err
	}); err != nil {
		return nil, err
	}
	floor, err := MeasureFloor(ctx, cfg, FloorOptions{Writers: []int{o.Clients}, Creates: o.Deliveries * WebhookWritesPerDelivery, Samples: 1})
	if err != nil {
		return nil, fmt.Errorf("measuring floor: %w", err)
	}
	res.FloorCreatesPerSec = floor.CreatesPerSec[o.Clients]
	res.CeilingDeliveriesPerSec = res.FloorCreatesPerSec / WebhookWritesPerDelivery
	res.ThroughputRatio = res.DeliveriesPerSec / res.CeilingDeliveriesPerSec
	return res, nil
}

// concurrently runs n calls of the func each of w workers builds, and returns calls/s.
func concurrently(w, n int, worker func() func() error) (float64, error) {
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range w {
		do := worker()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				if err := do(); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// paced starts n calls at rate per second, open loop, and measures each from its scheduled
// start, so a slow call delays the measurement of the calls behind it instead of hiding them.
func paced(ctx context.Context, rate float64, n int, call func() error) ([]time.Duration, error) {
	interval := time.Duration(float64(time.Second) / rate)
	d := make([]time.Duration, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if wait := time.Until(at); wait > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(wait):
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := call(); err != nil {
				errs <- err
				return
			}
			d[i] = time.Since(at)
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	return d, nil
}

// WebhookWritesPerDelivery is what the listener must write for a new delivery (see
// createPair): the ceiling is the floor's creates/s divided by it.
const WebhookWritesPerDelivery = 3

// createPair is a delivery's writes without the listener, in the listener's order: the
// PullRequest, its Event, and the Delivery record, created complete.
func createPair(ctx context.Context, c client.Client, ns string, n int64) error {
	now := metav1.Now()
	pr := &scmv1alpha1.PullRequest{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("floor-%d", n)},
		Spec: scmv1alpha1.PullRequestSpec{User: "mona", Branch: "feature/login", Status: scmv1alpha1.PullRequestOpen,
			ID: n, Repository: "octo-org/bench", Number: n, LastAction: "opened", UpdatedAt: &now},
	}
	if err := c.Create(ctx, pr); err != nil {
		return fmt.Errorf("floor create: %w", err)
	}
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("floor-%d.d", n)},
		InvolvedObject: corev1.ObjectReference{APIVersion: scmv1alpha1.GroupVersion.String(), Kind: "PullRequest",
			Namespace: ns, Name: pr.Name, UID: pr.UID},
		Reason: "PullRequestOpened", Message: "floor", Type: corev1.EventTypeNormal, Action: "opened",
		ReportingController: webhook.ReportingController, ReportingInstance: "bench",
		EventTime: metav1.NewMicroTime(now.Time), FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if err := c.Create(ctx, ev); err != nil {
		return fmt.Errorf("floor event: %w", err)
	}
	rec := &scmv1alpha1.Delivery{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("floor-%d", n)},
		Spec:       scmv1alpha1.DeliverySpec{DeliveryID: fmt.Sprintf("floor-%d", n), Event: "pull_request", ReceivedAt: now},
		Status: scmv1alpha1.DeliveryStatus{Result: scmv1alpha1.DeliveryCreated, Object: "pullrequests/" + pr.Name,
			EventName: ev.Name, CompletedAt: &now},
	}
	if err := c.Create(ctx, rec); err != nil {
		return fmt.Errorf("floor record: %w", err)
	}
	return nil
}

// prPayload is a pull_request "opened" delivery for pull request n, with the fields GitHub
// sends that the listener reads and a body of realistic size (~4 KiB).
func prPayload(n int64) []byte {
	return fmt.Appendf(nil, `{"action":"opened","number":%[1]d,"pull_request":{"url":"https://api.github.com/repos/octo-org/bench/pulls/%[1]d",`+
		`"id":%[2]d,"node_id":"PR_kwDOBench%[1]d","html_url":"https://github.com/octo-org/bench/pull/%[1]d","number":%[1]d,"state":"open",`+
		`"locked":false,"title":"Benchmark pull request %[1]d","user":{"login":"mona","id":583231,"type":"User","site_admin":false},`+
		`"body":"%[3]s","created_at":"2026-03-02T10:06:00Z","updated_at":"2026-03-02T10:06:00Z","closed_at":null,"merged_at":null,`+
		`"merge_commit_sha":null,"draft":false,"head":{"label":"octo-org:feature/login","ref":"feature/login",`+
		`"sha":"c4f1e0f8a3c0b4f2a6b9b9e0c2d3e4f5a6b7c8d9"},"base":{"label":"octo-org:main","ref":"main",`+
		`"sha":"9049f1265b7d61be4a8904a9a27120d2064dab3b"},"author_association":"MEMBER","merged":false,"comments":0,`+
		`"commits":2,"additions":120,"deletions":4,"changed_files":3},"repository":{"id":186853002,"name":"bench",`+
		`"full_name":"octo-org/bench","private":false,"owner":{"login":"octo-org","id":9919,"type":"Organization"},`+
		`"default_branch":"main","pushed_at":"2026-03-02T10:05:00Z"},"sender":{"login":"mona","id":583231,"type":"User"}}`,
		n, 2061340000+n, bytes.Repeat([]byte("Lorem ipsum dolor sit amet. "), 120))
}
