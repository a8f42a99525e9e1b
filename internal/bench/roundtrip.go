package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/internal/books"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/services"
	"github.com/crdipc/crdipc/internal/tracing"
	"github.com/crdipc/crdipc/ipc"
)

// RoundTripOptions sizes the round-trip benchmark.
type RoundTripOptions struct {
	Floor FloorOptions
	// Samples is how many sequential Calls the latency measurement makes.
	Samples int
	// Senders are the concurrency levels for the throughput measurement.
	Senders []int
	// Calls is how many Calls each throughput level makes.
	Calls int
	// InProcess says the API server runs in this process (the embedded control plane):
	// its request counter is read from this process's registry, not from its /metrics.
	InProcess bool
	// Tracing, when enabled, traces every Call as up does: the senders' spans and the
	// receiver's, their clients carrying the trace to the API server (whose own spans
	// are traced when it runs in this process with the same provider). Off: what a
	// service without OTEL_* variables runs.
	Tracing *tracing.Provider
}

// DefaultRoundTripOptions take ~30 s on a 2-core machine.
var DefaultRoundTripOptions = RoundTripOptions{Floor: DefaultFloorOptions, Samples: 300, Senders: []int{1, 8, 32}, Calls: 1000}

// RoundTrip is ipc.Call through the real Book receiver, next to the floor
// measured in the same run.
type RoundTrip struct {
	Floor *Floor `json:"floor"`
	// Latency is one sender's Call: create → receiver → status → watch.
	Latency Latencies `json:"latency"`
	// CallsPerSec maps sender count to completed Calls per second.
	CallsPerSec map[int]float64 `json:"callsPerSec"`
	// RequestWritesPerSec maps writer count to how many times per second
	// that many writers, each with its own client, make the three writes a
	// request costs (create the Book, update its status, create an Event)
	// back to back, without ipc: no watch, no informer, no receiver.
	RequestWritesPerSec map[int]float64 `json:"requestWritesPerSec"`
	// Ratios compare with the floor: latency to the floor's
	// create→status→watch, throughput to a third of the floor's creates/s (a
	// request needs three writes: the create, the status update and the
	// Event). WritesRatio compares throughput with RequestWritesPerSec
	// instead: what ipc itself costs, since a status update costs the API
	// server more than a create.
	P50Ratio        float64         `json:"p50Ratio"`
	P99Ratio        float64         `json:"p99Ratio"`
	ThroughputRatio map[int]float64 `json:"throughputRatio"`
	WritesRatio     map[int]float64 `json:"writesRatio"`
	// APIRequests are what one Call costs the API server, counted over the sequential
	// Calls of Latency (nothing else loads it then).
	APIRequests *APIRequests `json:"apiRequestsPerCall,omitempty"`
	// Tracing says every Call was traced (RoundTripOptions.Tracing).
	Tracing bool `json:"tracing"`
	// CallAPIRequests are what one Call costs the API server in each throughput run, by
	// sender count, and WritesAPIRequests what the same three writes made without ipc cost
	// it: side by side, the requests, etcd requests and watch events ipc adds.
	CallAPIRequests   map[int]*APIRequests `json:"apiRequestsPerCallAt,omitempty"`
	WritesAPIRequests map[int]*APIRequests `json:"apiRequestsPerThreeWritesAt,omitempty"`
}

// roundTripPath is what a request through the Book receiver touches: its Book and its
// Event.
var roundTripPath = pathOf(libraryv1alpha1.GroupVersion.Group)

// MeasureRoundTrip measures the floor, starts a Book receiver in this
// process (as `crdipc up` runs it) and measures Calls through it.
func MeasureRoundTrip(ctx context.Context, cfg *rest.Config, o RoundTripOptions) (*RoundTrip, error) {
	floor, err := MeasureFloor(ctx, cfg, o.Floor)
	if err != nil {
		return nil, err
	}
	// The senders' config: with tracing, each request made in a Call carries its trace.
	senderCfg := o.Tracing.RESTConfig(cfg, "bench-sender")
	var call []ipc.CallOption
	if o.Tracing.Enabled() {
		call = append(call, ipc.WithTracerProvider(o.Tracing.Service("bench-sender")))
	}
	c, err := client.NewWithWatch(senderCfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	ns, cleanup, err := tempNamespace(ctx, c, "bench-roundtrip-")
	if err != nil {
		return nil, err
	}
	defer cleanup()
	stop, err := startBooks(cfg, ns, o.Tracing)
	if err != nil {
		return nil, err
	}
	defer stop()

	rt := &RoundTrip{Floor: floor, Tracing: o.Tracing.Enabled(), CallsPerSec: map[int]float64{}, RequestWritesPerSec: map[int]float64{},
		ThroughputRatio: map[int]float64{}, WritesRatio: map[int]float64{},
		CallAPIRequests: map[int]*APIRequests{}, WritesAPIRequests: map[int]*APIRequests{}}
	// Warm up: the first requests pay for informer start and connection setup.
	if _, err := callBooks(ctx, []client.WithWatch{c}, ns, "warm", 20, call...); err != nil {
		return nil, err
	}
	counter, err := newRequestCounter(cfg, o.InProcess)
	if err != nil {
		return nil, err
	}
	var lat callResult
	rt.APIRequests, err = countRequests(ctx, counter, roundTripPath, fmt.Sprintf("%d sequential Calls", o.Samples), o.Samples, func() (err error) {
		lat, err = callBooks(ctx, []client.WithWatch{c}, ns, "lat", o.Samples, call...)
		return err
	})
	if err != nil {
		return nil, err
	}
	rt.Latency = summarize(lat.latencies)
	rt.P50Ratio = rt.Latency.P50 / floor.StatusRoundTrip.P50
	rt.P99Ratio = rt.Latency.P99 / floor.StatusRoundTrip.P99
	// In a namespace the receiver does not watch: these Books are nobody's requests.
	rawNS, rawCleanup, err := tempNamespace(ctx, c, "bench-writes-")
	if err != nil {
		return nil, err
	}
	defer rawCleanup()
	for _, s := range o.Senders {
		// Each run is counted once the requests of the one before have ended, so neither
		// starts on what the other left the API server to do.
		if rt.WritesAPIRequests[s], err = countRequests(ctx, counter, roundTripPath, fmt.Sprintf("%d requests' three writes, %d writers", o.Calls, s), o.Calls, func() (err error) {
			rt.RequestWritesPerSec[s], err = requestWrites(ctx, cfg, rawNS, s, o.Calls)
			return err
		}); err != nil {
			return nil, err
		}
		clients := make([]client.WithWatch, s)
		for i := range clients {
			if clients[i], err = client.NewWithWatch(rest.CopyConfig(senderCfg), client.Options{Scheme: scheme.Scheme}); err != nil {
				return nil, fmt.Errorf("creating client: %w", err)
			}
		}
		var res callResult
		if rt.CallAPIRequests[s], err = countRequests(ctx, counter, roundTripPath, fmt.Sprintf("%d Calls, %d senders", o.Calls, s), o.Calls, func() (err error) {
			res, err = callBooks(ctx, clients, ns, fmt.Sprintf("tp%d", s), o.Calls, call...)
			return err
		}); err != nil {
			return nil, err
		}
		rt.CallsPerSec[s] = res.rate
		if ceiling := floor.CreatesPerSec[s] / 3; ceiling > 0 {
			rt.ThroughputRatio[s] = res.rate / ceiling
		}
		if raw := rt.RequestWritesPerSec[s]; raw > 0 {
			rt.WritesRatio[s] = res.rate / raw
		}
	}
	return rt, nil
}

// startBooks runs a Book receiver that watches only ns: the floor's
// thousands of Books elsewhere are not requests for it. With tracing, as up
// runs it.
func startBooks(cfg *rest.Config, ns string, tp *tracing.Provider) (func(), error) {
	mgr, err := ctrl.NewManager(tp.RESTConfig(rest.CopyConfig(cfg), "books"), ctrl.Options{
		Scheme:                 scheme.Scheme,
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	// As many workers as the largest sender count, so the receiver is not
	// the queue that limits throughput.
	o := ipc.Options{Name: "bench-book", MaxConcurrentReconciles: 32, LeaseDuration: -1}
	if tp.Enabled() {
		o.TracerProvider = tp.Service("books")
	}
	if err := books.Register(mgr, o); err != nil {
		return nil, err
	}
	stop, err := services.Start(context.Background(), "books", mgr)
	if err != nil {
		return nil, fmt.Errorf("receiver: %w", err)
	}
	return stop, nil
}

// timedCall is one ipc.Call of b, waiting at most 30 s for Ready, and how long it took.
func timedCall(ctx context.Context, c client.WithWatch, b *libraryv1alpha1.Book, opts ...ipc.CallOption) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t := time.Now()
	err := ipc.Call(ctx, c, b, ipc.Ready, opts...)
	return time.Since(t), err
}

type callResult struct {
	latencies []time.Duration
	rate      float64
}

// callBooks makes n Calls spread over the clients (one goroutine each).
func callBooks(ctx context.Context, clients []client.WithWatch, ns, prefix string, n int, opts ...ipc.CallOption) (callResult, error) {
	var next atomic.Int64
	var mu sync.Mutex
	var firstErr error
	lat := make([]time.Duration, 0, n)
	var wg sync.WaitGroup
	start := time.Now()
	for _, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				b := newBook(ns, fmt.Sprintf("%s-%d", prefix, i), "roundtrip")
				d, err := timedCall(ctx, c, b, opts...)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("call %s: %w", b.Name, err)
				}
				lat = append(lat, d)
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return callResult{}, firstErr
	}
	return callResult{latencies: lat, rate: float64(n) / time.Since(start).Seconds()}, nil
}

// requestWrites makes the three writes of n requests (create, status update,
// Event) from w writers with a client each, and reports requests per second.
func requestWrites(ctx context.Context, cfg *rest.Config, ns string, w, n int) (float64, error) {
	var next atomic.Int64
	var mu sync.Mutex
	var firstErr error
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	clients := make([]client.Client, w)
	for i := range clients {
		var err error
		if clients[i], err = client.New(rest.CopyConfig(cfg), client.Options{Scheme: scheme.Scheme}); err != nil {
			return 0, fmt.Errorf("creating client: %w", err)
		}
	}
	var wg sync.WaitGroup
	start := time.Now()
	for _, c := range clients {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				b := newBook(ns, fmt.Sprintf("w%d-%d", w, i), "roundtrip")
				if err := c.Create(ctx, b); err != nil {
					fail(fmt.Errorf("create: %w", err))
					return
				}
				// The status the Book receiver writes: both conditions, observedGeneration.
				now := metav1.Now()
				b.Status.ObservedGeneration = b.Generation
				b.Status.Conditions = []metav1.Condition{
					{Type: conditions.TypeReady, Status: metav1.ConditionTrue, Reason: conditions.ReasonSucceeded, ObservedGeneration: b.Generation, LastTransitionTime: now},
					{Type: conditions.TypeProgressing, Status: metav1.ConditionFalse, Reason: conditions.ReasonSucceeded, Message: "done", ObservedGeneration: b.Generation, LastTransitionTime: now},
				}
				if err := c.Status().Update(ctx, b); err != nil {
					fail(fmt.Errorf("status update: %w", err))
					return
				}
				ev := &corev1.Event{
					ObjectMeta:     metav1.ObjectMeta{Namespace: ns, Name: b.Name + ".ready"},
					InvolvedObject: corev1.ObjectReference{APIVersion: libraryv1alpha1.GroupVersion.String(), Kind: "Book", Namespace: ns, Name: b.Name, UID: b.UID},
					Reason:         conditions.ReasonSucceeded, Message: "Ready=True", Type: corev1.EventTypeNormal, Count: 1,
					FirstTimestamp: now, LastTimestamp: now,
				}
				if err := c.Create(ctx, ev); err != nil {
					fail(fmt.Errorf("event: %w", err))
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(n) / time.Since(start).Seconds(), nil
}
