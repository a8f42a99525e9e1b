package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/internal/scheme"
)

// FloorOptions sizes the floor measurement.
type FloorOptions struct {
	// Writers are the concurrency levels for the create throughput test.
	Writers []int
	// Creates is how many objects each throughput level creates.
	Creates int
	// Samples is how many round trips each latency test measures.
	Samples int
}

// floorCleanupTimeout bounds the wait for the floor's namespace to be deleted.
const floorCleanupTimeout = 2 * time.Minute

// DefaultFloorOptions take ~10 s on a 2-core machine.
var DefaultFloorOptions = FloorOptions{Writers: []int{1, 8, 32}, Creates: 1500, Samples: 300}

// Floor is what the API server alone does with small custom resources.
type Floor struct {
	// CreatesPerSec maps writer count to creates per second.
	CreatesPerSec map[int]float64 `json:"createsPerSec"`
	// CreateToWatch is create call start → the creator's watch delivers it.
	CreateToWatch Latencies `json:"createToWatch"`
	// StatusRoundTrip is create → another client sees it and writes status →
	// the creator's watch delivers the status: the minimum any CR-based
	// request/response can cost.
	StatusRoundTrip Latencies `json:"statusRoundTrip"`
}

// MeasureFloor runs the three floor measurements in a namespace it creates
// and deletes. cfg must allow unthrottled clients (QPS < 0).
func MeasureFloor(ctx context.Context, cfg *rest.Config, o FloorOptions) (*Floor, error) {
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	ns, _, err := tempNamespace(ctx, c, "bench-floor-")
	if err != nil {
		return nil, err
	}
	// Every bench measures its floor first and itself next: the namespace controller
	// deleting the floor's thousands of Books meanwhile would load the API server under
	// that measurement. Wait for it (bounded: a slow deletion delays, never fails, the bench).
	defer func() { _ = deleteNamespace(c, ns, floorCleanupTimeout) }()

	f := &Floor{CreatesPerSec: map[int]float64{}}
	for _, w := range o.Writers {
		rate, err := createThroughput(ctx, cfg, ns, w, o.Creates)
		if err != nil {
			return nil, err
		}
		f.CreatesPerSec[w] = rate
	}
	if f.CreateToWatch, err = createToWatch(ctx, c, ns, o.Samples); err != nil {
		return nil, err
	}
	// The responder has its own client, hence its own connection, as a
	// separate receiver process would.
	responder, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	if f.StatusRoundTrip, err = statusRoundTrip(ctx, c, responder, ns, o.Samples); err != nil {
		return nil, err
	}
	return f, nil
}

func tempNamespace(ctx context.Context, c client.Client, prefix string) (string, func(), error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}
	if err := c.Create(ctx, ns); err != nil {
		return "", nil, fmt.Errorf("creating namespace: %w", err)
	}
	return ns.Name, func() {
		// Deletion is asynchronous (namespace controller); nothing waits on it.
		_ = c.Delete(context.Background(), ns)
	}, nil
}

// benchLabel marks every object a bench creates with the bench's name.
const benchLabel = "crdipc.io/bench"

// newBook is the Book every bench creates, labelled with the bench's name.
func newBook(ns, name, bench string) *libraryv1alpha1.Book {
	return &libraryv1alpha1.Book{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{benchLabel: bench}},
		Spec:       libraryv1alpha1.BookSpec{Title: "The Go Programming Language", Author: "Donovan and Kernighan"},
	}
}

// createThroughput creates n objects from w goroutines, each with its own
// client (own HTTP/2 connection), and reports creates per second.
func createThroughput(ctx context.Context, cfg *rest.Config, ns string, w, n int) (float64, error) {
	clients := make([]client.Client, w)
	for i := range clients {
		c, err := client.New(rest.CopyConfig(cfg), client.Options{Scheme: scheme.Scheme})
		if err != nil {
			return 0, fmt.Errorf("creating client: %w", err)
		}
		clients[i] = c
	}
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for i := range w {
		wg.Add(1)
		go func(c client.Client) {
			defer wg.Done()
			for {
				j := next.Add(1)
				if j > int64(n) {
					return
				}
				if err := c.Create(ctx, newBook(ns, fmt.Sprintf("tp-%d-%d", w, j), "floor")); err != nil {
					once.Do(func() { firstErr = fmt.Errorf("create: %w", err) })
					return
				}
			}
		}(clients[i])
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// watchFromNow watches the objects of list's kind in ns from now on: from the resource
// version of a list of one, so that no earlier event is replayed.
func watchFromNow(ctx context.Context, c client.WithWatch, list client.ObjectList, ns string) (watch.Interface, error) {
	if err := c.List(ctx, list, client.InNamespace(ns), client.Limit(1)); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	w, err := c.Watch(ctx, list, client.InNamespace(ns), &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: list.GetResourceVersion()}})
	if err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	return w, nil
}

// next returns the first event for the named object that satisfies ok.
func nextEvent(ctx context.Context, w watch.Interface, name string, ok func(*libraryv1alpha1.Book) bool) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, open := <-w.ResultChan():
			if !open {
				return fmt.Errorf("watch closed")
			}
			if b, isBook := ev.Object.(*libraryv1alpha1.Book); isBook && b.Name == name && ok(b) {
				return nil
			}
		}
	}
}

func createToWatch(ctx context.Context, c client.WithWatch, ns string, n int) (Latencies, error) {
	w, err := watchFromNow(ctx, c, &libraryv1alpha1.BookList{}, ns)
	if err != nil {
		return Latencies{}, err
	}
	defer w.Stop()
	d := make([]time.Duration, 0, n)
	for i := range n {
		name := fmt.Sprintf("cw-%d", i)
		t := time.Now()
		if err := c.Create(ctx, newBook(ns, name, "floor")); err != nil {
			return Latencies{}, fmt.Errorf("create: %w", err)
		}
		if err := nextEvent(ctx, w, name, func(*libraryv1alpha1.Book) bool { return true }); err != nil {
			return Latencies{}, err
		}
		d = append(d, time.Since(t))
	}
	return summarize(d), nil
}

func statusRoundTrip(ctx context.Context, c, responder client.WithWatch, ns string, n int) (Latencies, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rw, err := watchFromNow(ctx, responder, &libraryv1alpha1.BookList{}, ns)
	if err != nil {
		return Latencies{}, err
	}
	defer rw.Stop()
	respErr := make(chan error, 1)
	go func() {
		for ev := range rw.ResultChan() {
			b, ok := ev.Object.(*libraryv1alpha1.Book)
			if !ok || ev.Type != watch.Added {
				continue
			}
			b.Status.ObservedGeneration = b.Generation
			if err := responder.Status().Update(ctx, b); err != nil && ctx.Err() == nil {
				respErr <- fmt.Errorf("status update: %w", err)
				return
			}
		}
	}()
	w, err := watchFromNow(ctx, c, &libraryv1alpha1.BookList{}, ns)
	if err != nil {
		return Latencies{}, err
	}
	defer w.Stop()
	d := make([]time.Duration, 0, n)
	for i := range n {
		name := fmt.Sprintf("rt-%d", i)
		t := time.Now()
		if err := c.Create(ctx, newBook(ns, name, "floor")); err != nil {
			return Latencies{}, fmt.Errorf("create: %w", err)
		}
		if err := nextEvent(ctx, w, name, func(b *libraryv1alpha1.Book) bool { return b.Status.ObservedGeneration > 0 }); err != nil {
			select {
			case rerr := <-respErr:
				return Latencies{}, rerr
			default:
			}
			return Latencies{}, err
		}
		d = append(d, time.Since(t))
	}
	return summarize(d), nil
}
