package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/internal/cpushare"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/services"
)

// ScaleOptions size the scale benchmark.
type ScaleOptions struct {
	// Sizes are the Book populations measured, ascending: the population grows from one to
	// the next.
	Sizes []int
	// Writers create the population concurrently, each on its own connection.
	Writers int
	// CallSamples are the sequential ipc.Calls measured at each size.
	CallSamples int
	// IdleWindow is how long the process's CPU is sampled while nothing is asked of it.
	IdleWindow time.Duration
	// MinCachedObjects: at small sizes, as many fresh caches are built side by side as make
	// this many cached objects, so that the heap figure is not lost in the noise of the
	// rest of the process.
	MinCachedObjects int
	// InProcess says the control plane and the Book receiver run in this process (bench
	// without --kubeconfig, like up), so its RSS and heap are theirs.
	InProcess bool
	// TargetMetrics, with a cluster served by another process (--kubeconfig), is that
	// process's Prometheus /metrics URL (crdipc up's --metrics-addr): its RSS, heap,
	// goroutines and idle CPU are then the figures, instead of bench's own.
	TargetMetrics string
	// HeapProfile, when set, gets a pprof heap profile of this process at the largest size.
	HeapProfile string
	// Progress, when set, is told what the benchmark is doing.
	Progress func(format string, a ...any)
}

// DefaultScaleOptions take about 15 minutes on a 2-core machine, most of it creating the
// 100,000 Books.
var DefaultScaleOptions = ScaleOptions{
	Sizes: []int{1000, 10000, 100000}, Writers: 32, CallSamples: 200,
	IdleWindow: 5 * time.Second, MinCachedObjects: 20000,
}

// Goals of the scale benchmark, from the issue that introduced it.
const (
	ScaleCacheBytesGoal = 2048    // heap per cached Book at the largest size
	ScaleCallRatioGoal  = 1.2     // Call p50 at the largest size over the first size's
	ScaleRSSGoal        = 2 << 30 // RSS of the process (control plane + services) at 100k Books
	ScaleRSSGoalSize    = 100000  // the size the RSS goal is about
)

// Scale is how costs grow with the number of Books in the cluster.
type Scale struct {
	InProcess bool `json:"inProcess"`
	// TargetMetrics is the /metrics URL whose process's memory and CPU the figures are, when
	// not this process's (ScaleOptions.TargetMetrics).
	TargetMetrics string `json:"targetMetrics,omitempty"`
	// Baseline is the process before any Book, services idle.
	Baseline            ScaleMemory    `json:"baseline"`
	BaselineIdleCores   float64        `json:"baselineIdleCores"`
	BaselineIdleCoresBy cpushare.Cores `json:"baselineIdleCoresByComponent,omitempty"`
	// IdleByComponentError says why idle CPU could not be divided by component.
	IdleByComponentError string      `json:"idleByComponentError,omitempty"`
	Steps                []ScaleStep `json:"steps"`
	// Goals at the largest size.
	CacheBytesGoal float64 `json:"cacheBytesGoal"`
	CacheBytesMet  bool    `json:"cacheBytesMet"`
	CallRatioGoal  float64 `json:"callRatioGoal"`
	CallRatioMet   bool    `json:"callRatioMet"`
	// RSSGoalBytes applies at ScaleRSSGoalSize Books, in process only.
	RSSGoalBytes uint64 `json:"rssGoalBytes"`
	RSSMet       *bool  `json:"rssMet,omitempty"`
	// CleanupSeconds is how long deleting the namespace took, every Book and Event in it.
	CleanupSeconds float64 `json:"cleanupSeconds"`
	CleanupError   string  `json:"cleanupError,omitempty"`
}

// ScaleMemory is the process's memory after a GC.
type ScaleMemory struct {
	// RSSBytes is VmRSS, PeakRSSBytes VmHWM, from /proc/self/status.
	RSSBytes     uint64 `json:"rssBytes"`
	PeakRSSBytes uint64 `json:"peakRssBytes"`
	// RSSFileBytes is the part of RSS that maps files (RssFile): etcd's database, the binary.
	RSSFileBytes uint64 `json:"rssFileBytes"`
	// HeapBytes is the live Go heap (HeapAlloc after a GC).
	HeapBytes uint64 `json:"heapBytes"`
	// HeapInuseBytes counts the heap's spans in use, fragmentation included; StackBytes
	// the goroutines' stacks.
	HeapInuseBytes uint64 `json:"heapInuseBytes"`
	StackBytes     uint64 `json:"stackBytes"`
	// ReleasedRSSBytes is VmRSS once the Go runtime returned every free page to the OS:
	// RSS above it is garbage the runtime keeps for reuse, not what the process needs.
	ReleasedRSSBytes uint64 `json:"releasedRssBytes"`
	Goroutines       int    `json:"goroutines"`
}

// ScaleStep is everything measured at one population.
type ScaleStep struct {
	Books int `json:"books"`
	// Events counts the Events in the namespace (the receiver records one per Book), when the
	// API server says (-1 if it did not).
	Events int `json:"events"`
	// PopulateSeconds: creating the Books added at this step and waiting until every Book
	// is Ready; CreatesPerSec and ReadyPerSec are its two rates.
	PopulateSeconds float64 `json:"populateSeconds"`
	CreatesPerSec   float64 `json:"createsPerSec"`
	ReadyPerSec     float64 `json:"readyPerSec"`
	// Memory is the process after the population is Ready; per Book figures are over the
	// baseline.
	Memory      ScaleMemory `json:"memory"`
	RSSPerBook  float64     `json:"rssPerBook"`
	HeapPerBook float64     `json:"heapPerBook"`
	IdleCores   float64     `json:"idleCores"`
	// IdleCoresBy divides IdleCores between the process's components, as the CPU profiler
	// sampled them (cpushare): etcd, kube-apiserver, kube-controller-manager, the services,
	// bench's own clients, and what carries no component (the Go runtime's garbage
	// collector).
	IdleCoresBy   cpushare.Cores `json:"idleCoresByComponent,omitempty"`
	CacheCopies   int            `json:"cacheCopies"`
	CacheBytesPer float64        `json:"cacheBytesPerObject"`
	// CacheBytesRounds are the rounds' figures; CacheBytesPer is their median.
	CacheBytesRounds []float64 `json:"cacheBytesRounds"`
	// CacheFixedBytes is what one cache costs with no object in it.
	CacheFixedBytes float64 `json:"cacheFixedBytes"`
	CacheSyncMs     float64 `json:"cacheSyncMs"`
	ListMs          float64 `json:"listMs"`
	PagedListMs     float64 `json:"pagedListMs"`
	PagedListLimit  int64   `json:"pagedListLimit"`
	// ListError says why a list failed (the figures of the lists are then 0).
	ListError string    `json:"listError,omitempty"`
	Call      Latencies `json:"call"`
	// CallErrors counts Calls that failed (each has 30 s); the figures are the others'.
	CallErrors int    `json:"callErrors"`
	CallError  string `json:"callError,omitempty"`
	// CallP50Ratio is Call p50 here over the first size's.
	CallP50Ratio float64 `json:"callP50Ratio"`
}

const (
	scalePageLimit = 500
)

// StartBooksService runs the books entry of the service table in this process, on a
// manager of its own, as up runs it.
func StartBooksService(ctx context.Context, cfg *rest.Config) (stop func(), err error) {
	e, ok := services.Lookup("books")
	if !ok {
		return nil, errors.New("the service table has no books entry")
	}
	mgr, err := services.Build(cfg, e, e.New(), services.ManagerOptions{Repeatable: true}, services.Env{Config: cfg})
	if err != nil {
		return nil, err
	}
	stop, err = services.Start(ctx, e.Name, mgr)
	if err != nil {
		return nil, fmt.Errorf("books service: %w", err)
	}
	return stop, nil
}

// MeasureScale grows a population of Books, served by a Book receiver that must already
// run (StartBooksService), through o.Sizes and measures at each size; it deletes the
// population at the end.
func MeasureScale(ctx context.Context, cfg *rest.Config, o ScaleOptions) (_ *Scale, retErr error) {
	if len(o.Sizes) == 0 {
		return nil, errors.New("no sizes to measure")
	}
	for i, n := range o.Sizes {
		if n <= 0 || (i > 0 && n <= o.Sizes[i-1]) {
			return nil, fmt.Errorf("sizes %v: want positive sizes in ascending order", o.Sizes)
		}
	}
	if o.InProcess && o.TargetMetrics != "" {
		return nil, errors.New("target metrics are for a cluster served by another process: this one serves it")
	}
	if o.Writers <= 0 || o.CallSamples <= 0 || o.IdleWindow <= 0 {
		return nil, fmt.Errorf("writers %d, call samples %d, idle window %s: want all positive", o.Writers, o.CallSamples, o.IdleWindow)
	}
	say := o.Progress
	if say == nil {
		say = func(string, ...any) {}
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return nil, fmt.Errorf("creating client: %w", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-scale-"}}
	if err := c.Create(ctx, ns); err != nil {
		return nil, fmt.Errorf("creating namespace: %w", err)
	}
	s := &Scale{InProcess: o.InProcess, TargetMetrics: o.TargetMetrics, CacheBytesGoal: ScaleCacheBytesGoal, CallRatioGoal: ScaleCallRatioGoal, RSSGoalBytes: ScaleRSSGoal}
	defer func() {
		// The largest size's namespace takes minutes to empty; wait for it (bounded), so
		// that the cluster is as the benchmark found it.
		t := time.Now()
		if err := deleteNamespace(c, ns.Name, 2*time.Minute+time.Duration(o.Sizes[len(o.Sizes)-1])*10*time.Millisecond); err != nil {
			s.CleanupError = err.Error()
			if retErr != nil {
				retErr = errors.Join(retErr, err)
			}
		}
		s.CleanupSeconds = time.Since(t).Seconds()
	}()

	tracker, err := trackReady(ctx, c, ns.Name)
	if err != nil {
		return nil, err
	}
	defer tracker.stop()
	// The services and the control plane settle before the baseline: what they allocate
	// while starting is not what they hold.
	idle, memory := idleCPU, func(context.Context) (ScaleMemory, error) { return readMemory(), nil }
	if o.TargetMetrics != "" {
		idle = func(ctx context.Context, d time.Duration) (float64, cpushare.Cores, string, error) {
			cores, err := scrapeIdleCPU(ctx, o.TargetMetrics, d)
			return cores, nil, "the target is another process, which bench cannot profile", err
		}
		memory = func(ctx context.Context) (ScaleMemory, error) { return scrapeMemory(ctx, o.TargetMetrics) }
	}
	if s.BaselineIdleCores, s.BaselineIdleCoresBy, s.IdleByComponentError, err = idle(ctx, o.IdleWindow); err != nil {
		return nil, err
	}
	if s.Baseline, err = memory(ctx); err != nil {
		return nil, err
	}
	for i, size := range o.Sizes {
		// Counted, not computed: a Call that failed at the previous size may or may not
		// have left its Book.
		have, err := countItems(ctx, c, &libraryv1alpha1.BookList{}, ns.Name)
		if err != nil {
			return nil, err
		}
		add := max(size-have, 0)
		step := ScaleStep{PagedListLimit: scalePageLimit}
		say("growing to %d Books", size)
		t := time.Now()
		created, err := createBooks(ctx, cfg, ns.Name, tracker, o.Writers, add)
		if err != nil {
			return nil, err
		}
		step.CreatesPerSec = float64(add) / time.Since(t).Seconds()
		deadline := 2*time.Minute + time.Duration(add)*10*time.Millisecond
		if err := tracker.waitReady(ctx, created, deadline); err != nil {
			return nil, err
		}
		step.PopulateSeconds = time.Since(t).Seconds()
		step.ReadyPerSec = float64(add) / step.PopulateSeconds
		if step.Books, err = countItems(ctx, c, &libraryv1alpha1.BookList{}, ns.Name); err != nil {
			return nil, err
		}
		n := step.Books

		// The receiver writes each Book's Event after its Ready status: wait for them too.
		step.Events = waitEvents(ctx, c, ns.Name, n, 30*time.Second)
		if step.Memory, err = memory(ctx); err != nil {
			return nil, err
		}
		step.RSSPerBook = perObject(step.Memory.RSSBytes, s.Baseline.RSSBytes, n)
		step.HeapPerBook = perObject(step.Memory.HeapBytes, s.Baseline.HeapBytes, n)
		if o.HeapProfile != "" && i == len(o.Sizes)-1 {
			if err := writeHeapProfile(o.HeapProfile); err != nil {
				return nil, err
			}
		}
		say("%d Books Ready; sampling idle CPU for %s", n, o.IdleWindow)
		if step.IdleCores, step.IdleCoresBy, s.IdleByComponentError, err = idle(ctx, o.IdleWindow); err != nil {
			return nil, err
		}
		say("building fresh caches of %d Books", n)
		if err := measureCache(ctx, cfg, ns.Name, n, o.MinCachedObjects, &step); err != nil {
			return nil, err
		}
		say("listing %d Books", n)
		// A list the API server cannot serve in time is a finding at this size, not a
		// reason to lose the rest.
		if err := measureLists(ctx, c, ns.Name, n, &step); err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			step.ListError = err.Error()
		}
		say("%d ipc.Calls at %d Books", o.CallSamples, n)
		// A few Calls first, uncounted: connections and the receiver's queue warm up.
		warm := scaleCalls(ctx, c, ns.Name, fmt.Sprintf("warm-%d", size), 10)
		calls := scaleCalls(ctx, c, ns.Name, fmt.Sprintf("call-%d", size), o.CallSamples)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		step.CallErrors, step.CallError = calls.errors+warm.errors, cmp.Or(calls.firstErr, warm.firstErr)
		if len(calls.latencies) == 0 {
			return nil, fmt.Errorf("every ipc.Call at %d Books failed: %s", n, step.CallError)
		}
		step.Call = summarize(calls.latencies)
		if len(s.Steps) > 0 && s.Steps[0].Call.P50 > 0 {
			step.CallP50Ratio = step.Call.P50 / s.Steps[0].Call.P50
		} else {
			step.CallP50Ratio = 1
		}
		s.Steps = append(s.Steps, step)
	}
	// From Goals, in the order it returns them, so that the table and the JSON agree.
	goals := s.Goals()
	s.CacheBytesMet, s.CallRatioMet = goals[0].Met, goals[1].Met
	if goals[2].Unmeasured == "" {
		met := goals[2].Met
		s.RSSMet = &met
	}
	return s, nil
}

func perObject(v, base uint64, n int) float64 {
	return (float64(v) - float64(base)) / float64(n)
}

// createBooks creates n Books named pop-<i> after those the tracker already expects, from
// w writers with a connection each; it returns how many Books the tracker expects now.
func createBooks(ctx context.Context, cfg *rest.Config, ns string, tracker *readyTracker, w, n int) (int, error) {
	total := tracker.expect(n)
	if n <= 0 {
		return total, nil
	}
	var next atomic.Int64
	var once sync.Once
	var firstErr error
	var wg sync.WaitGroup
	for range min(w, n) {
		c, err := client.New(rest.CopyConfig(cfg), client.Options{Scheme: scheme.Scheme})
		if err != nil {
			return 0, fmt.Errorf("creating client: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				b := newBook(ns, popName(total-n+int(i)), "scale")
				b.Spec.ISBN = "978-0-13-419044-0"
				// A retry after a lost response finds its own Book: fine, it is the same one.
				err := retryCreate(ctx, c, b)
				if err != nil {
					once.Do(func() { firstErr = fmt.Errorf("creating %s: %w", b.Name, err) })
					return
				}
			}
		}()
	}
	wg.Wait()
	return total, firstErr
}

func retryCreate(ctx context.Context, c client.Client, b *libraryv1alpha1.Book) error {
	var err error
	for attempt := range 5 {
		if err = c.Create(ctx, b.DeepCopy()); err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		if !apierrors.IsTooManyRequests(err) && !apierrors.IsServerTimeout(err) && !apierrors.IsTimeout(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
	return err
}

func popName(i int) string { return "pop-" + strconv.Itoa(i) }

// readyTracker counts the population's Ready Books from one watch, keeping a bit per Book
// rather than the Books: it must not weigh on the memory it helps measure.
type readyTracker struct {
	mu       sync.Mutex
	ready    []bool
	count    int
	expected int
	changed  chan struct{}
	err      error
	cancel   context.CancelFunc
	done     chan struct{}
}

func trackReady(ctx context.Context, c client.WithWatch, ns string) (*readyTracker, error) {
	tctx, cancel := context.WithCancel(ctx)
	t := &readyTracker{changed: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	rv, err := t.relist(tctx, c, ns)
	if err != nil {
		cancel()
		return nil, err
	}
	go func() {
		defer close(t.done)
		t.run(tctx, c, ns, rv)
	}()
	return t, nil
}

func (t *readyTracker) stop() { t.cancel(); <-t.done }

// expect adds n Books to the population and returns its new size.
func (t *readyTracker) expect(n int) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expected += max(n, 0)
	return t.expected
}

func (t *readyTracker) observe(b *libraryv1alpha1.Book) {
	i, ok := strings.CutPrefix(b.Name, "pop-")
	if !ok {
		return
	}
	n, err := strconv.Atoi(i)
	if err != nil || n < 0 {
		return
	}
	ready := b.Status.ObservedGeneration >= b.Generation && apimeta.IsStatusConditionTrue(b.Status.Conditions, conditions.TypeReady)
	t.mu.Lock()
	if n >= len(t.ready) {
		t.ready = append(t.ready, make([]bool, n+1-len(t.ready)+len(t.ready)/2)...)
	}
	if ready != t.ready[n] {
		t.ready[n] = ready
		if ready {
			t.count++
		} else {
			t.count--
		}
	}
	t.mu.Unlock()
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

// relist reads every Book in pages and returns the list's resourceVersion to watch from.
func (t *readyTracker) relist(ctx context.Context, c client.Client, ns string) (string, error) {
	cont := ""
	for {
		var l libraryv1alpha1.BookList
		if err := c.List(ctx, &l, client.InNamespace(ns), client.Limit(scalePageLimit), client.Continue(cont)); err != nil {
			return "", fmt.Errorf("listing Books: %w", err)
		}
		for i := range l.Items {
			t.observe(&l.Items[i])
		}
		if cont = l.Continue; cont == "" {
			return l.ResourceVersion, nil
		}
	}
}

func (t *readyTracker) run(ctx context.Context, c client.WithWatch, ns, rv string) {
	fail := func(err error) {
		t.mu.Lock()
		t.err = err
		t.mu.Unlock()
		select {
		case t.changed <- struct{}{}:
		default:
		}
	}
	for ctx.Err() == nil {
		w, err := c.Watch(ctx, &libraryv1alpha1.BookList{}, client.InNamespace(ns),
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
		if err != nil {
			if ctx.Err() == nil {
				fail(fmt.Errorf("watching Books: %w", err))
			}
			return
		}
		expired := false
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Error:
				expired = apierrors.IsResourceExpired(apierrors.FromObject(ev.Object)) || apierrors.IsGone(apierrors.FromObject(ev.Object))
			case watch.Added, watch.Modified, watch.Bookmark:
				if b, ok := ev.Object.(*libraryv1alpha1.Book); ok {
					rv = b.ResourceVersion
					if ev.Type != watch.Bookmark {
						t.observe(b)
					}
				}
			}
			if expired {
				break
			}
		}
		w.Stop()
		if expired {
			if rv, err = t.relist(ctx, c, ns); err != nil {
				if ctx.Err() == nil {
					fail(err)
				}
				return
			}
		}
	}
}

// waitReady waits until the first n Books of the population are Ready, for at most d.
func (t *readyTracker) waitReady(ctx context.Context, n int, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		t.mu.Lock()
		count, err := t.count, t.err
		t.mu.Unlock()
		if err != nil {
			return err
		}
		if count >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d Books Ready after %s: %w", count, n, d, ctx.Err())
		case <-t.changed:
		}
	}
}

// waitEvents returns the number of the namespace's Events once there are at least n, or
// after d with as many as there are then (-1 when they cannot be counted).
func waitEvents(ctx context.Context, c client.Client, ns string, n int, d time.Duration) int {
	events := -1
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, d, true, func(ctx context.Context) (bool, error) {
		events = countEvents(ctx, c, ns)
		return events >= n, nil
	})
	return events
}

// countEvents is countItems of the namespace's Events, or -1.
func countEvents(ctx context.Context, c client.Client, ns string) int {
	n, err := countItems(ctx, c, &corev1.EventList{}, ns)
	if err != nil {
		return -1
	}
	return n
}

// countItems counts the objects of list's kind in ns: from a list of one and its
// remainingItemCount when the API server gives it, else from a list of metadata in pages.
func countItems(ctx context.Context, c client.Client, list client.ObjectList, ns string) (int, error) {
	if err := c.List(ctx, list, client.InNamespace(ns), client.Limit(1)); err != nil {
		return 0, fmt.Errorf("counting: %w", err)
	}
	n := apimeta.LenList(list)
	if list.GetContinue() == "" {
		return n, nil
	}
	if r := list.GetRemainingItemCount(); r != nil {
		return n + int(*r), nil
	}
	gvk, err := apiutil.GVKForObject(list, c.Scheme())
	if err != nil {
		return 0, err
	}
	meta := &metav1.PartialObjectMetadataList{}
	meta.SetGroupVersionKind(gvk)
	n, cont := 0, ""
	for {
		if err := c.List(ctx, meta, client.InNamespace(ns), client.Limit(scalePageLimit), client.Continue(cont)); err != nil {
			return 0, fmt.Errorf("counting: %w", err)
		}
		n += len(meta.Items)
		if cont = meta.Continue; cont == "" {
			return n, nil
		}
	}
}

// readMemory collects garbage first: the figures are what the process holds, not what it
// has not freed yet.
func readMemory() ScaleMemory {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	rss, peak, file := procStatus()
	mem := ScaleMemory{
		RSSBytes: rss, PeakRSSBytes: peak, RSSFileBytes: file, HeapBytes: m.HeapAlloc, HeapInuseBytes: m.HeapInuse, StackBytes: m.StackInuse,
		Goroutines: runtime.NumGoroutine(),
	}
	debug.FreeOSMemory()
	mem.ReleasedRSSBytes, _, _ = procStatus()
	return mem
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// procStatus reads VmRSS, VmHWM and RssFile (kB) from /proc/self/status; zeros where there
// is none.
func procStatus() (rss, peak, file uint64) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, 0, 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			rss = v << 10
		case "VmHWM:":
			peak = v << 10
		case "RssFile:":
			file = v << 10
		}
	}
	return rss, peak, file
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return fmt.Errorf("heap profile: %w", err)
	}
	return f.Close()
}

// idleCPU is the CPU time this process used during d, in cores, and how it divides between
// the components running in it (cpushare). The division needs the CPU profiler: while
// another profile runs (bench --cpu-profile) it is nil and byErr says why.
func idleCPU(ctx context.Context, d time.Duration) (total float64, by cpushare.Cores, byErr string, err error) {
	c0, err := processCPU()
	if err != nil {
		return 0, nil, "", err
	}
	t0 := time.Now()
	shares, serr := cpushare.Measure(ctx, d)
	if serr != nil {
		if ctx.Err() != nil {
			return 0, nil, "", ctx.Err()
		}
		byErr = serr.Error()
		select {
		case <-ctx.Done():
			return 0, nil, "", ctx.Err()
		case <-time.After(d - time.Since(t0)):
		}
	}
	c1, err := processCPU()
	if err != nil {
		return 0, nil, "", err
	}
	return (c1 - c0).Seconds() / time.Since(t0).Seconds(), shares.Cores, byErr, nil
}

// processCPU is the user and system CPU time this process has used.
func processCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// measureCache builds caches of Books as the services build theirs (managedFields
// stripped), enough of them to hold at least minObjects (at most maxCacheCopies), and
// measures the live heap they add per cached Book and how long one takes to sync. What a
// cache costs with no object at all (its informer, client, goroutines) is measured with as
// many caches whose label selector matches nothing, and taken off: it is not per object.
//
// The heap is the whole process's, and the rest of the process moves it too: at 100,000
// Books a compaction of etcd (the API server asks for one every 5 minutes) holds tens to
// hundreds of MiB while it runs. The full caches are therefore built cacheRounds times,
// each measured against the heap just before and just after it, and the median round is
// the figure.
func measureCache(ctx context.Context, cfg *rest.Config, ns string, n, minObjects int, step *ScaleStep) error {
	copies := min(maxCacheCopies, max(1, (minObjects+n-1)/n))
	nothing, err := labels.Parse(benchLabel + "=none")
	if err != nil {
		return err
	}
	before := liveHeap()
	_, stop, err := buildCaches(ctx, cfg, ns, copies, nothing, 0)
	if err != nil {
		return err
	}
	empty := liveHeap()
	stop()
	fixed := float64(empty) - float64(before)
	var all []time.Duration
	rounds := make([]float64, 0, cacheRounds)
	without := liveHeap()
	for range cacheRounds {
		syncs, stop, err := buildCaches(ctx, cfg, ns, copies, nil, n)
		if err != nil {
			return err
		}
		full := liveHeap()
		stop()
		after := liveHeap()
		// The heap without the caches, before and after: their mean is the rest of the
		// process, which allocates in the meantime too.
		base := (float64(without) + float64(after)) / 2
		rounds = append(rounds, (float64(full)-base-fixed)/float64(copies*n))
		all = append(all, syncs...)
		without = after
	}
	step.CacheCopies = copies
	step.CacheFixedBytes = fixed / float64(copies)
	step.CacheBytesRounds = rounds
	step.CacheBytesPer = slices.Sorted(slices.Values(rounds))[len(rounds)/2]
	slices.Sort(all)
	step.CacheSyncMs = ms(all[len(all)/2])
	return nil
}

// cacheRounds is how many times measureCache builds the full caches; odd, for a median.
const cacheRounds = 3

// maxCacheCopies bounds the caches built at once for the heap measurement.
const maxCacheCopies = 20

// buildCaches starts k caches of the Books in ns matching sel (nil: all), checks that each
// holds want Books, and returns how long each took to sync and a func that stops them.
func buildCaches(ctx context.Context, cfg *rest.Config, ns string, k int, sel labels.Selector, want int) (syncs []time.Duration, stop func(), err error) {
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stopAll := func() { cancel(); wg.Wait() }
	defer func() {
		if err != nil {
			stopAll()
		}
	}()
	for range k {
		c, cerr := cache.New(cfg, cache.Options{
			Scheme:            scheme.Scheme,
			DefaultTransform:  cache.TransformStripManagedFields(),
			DefaultNamespaces: map[string]cache.Config{ns: {LabelSelector: sel}},
		})
		if cerr != nil {
			return nil, nil, fmt.Errorf("creating cache: %w", cerr)
		}
		t := time.Now()
		wg.Add(1)
		go func() { defer wg.Done(); _ = c.Start(cctx) }()
		if _, err = c.GetInformer(cctx, &libraryv1alpha1.Book{}); err != nil {
			return nil, nil, fmt.Errorf("cache of Books: %w", err)
		}
		if !c.WaitForCacheSync(cctx) {
			return nil, nil, errors.New("cache of Books did not sync")
		}
		syncs = append(syncs, time.Since(t))
		var l libraryv1alpha1.BookList
		if err = c.List(cctx, &l); err != nil {
			return nil, nil, fmt.Errorf("listing cached Books: %w", err)
		}
		if len(l.Items) != want {
			return nil, nil, fmt.Errorf("cache holds %d Books, want %d", len(l.Items), want)
		}
	}
	return syncs, stopAll, nil
}

// measureLists times a full List of the Books (median of three) and a paginated one.
func measureLists(ctx context.Context, c client.Client, ns string, n int, step *ScaleStep) error {
	if err := measureFullList(ctx, c, ns, n, step); err != nil {
		// The paginated list may still work where the full one times out.
		return errors.Join(err, measurePagedList(ctx, c, ns, n, step))
	}
	return measurePagedList(ctx, c, ns, n, step)
}

func measureFullList(ctx context.Context, c client.Client, ns string, n int, step *ScaleStep) error {
	var full []time.Duration
	for range 3 {
		var l libraryv1alpha1.BookList
		t := time.Now()
		if err := c.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return fmt.Errorf("listing Books: %w", err)
		}
		full = append(full, time.Since(t))
		if len(l.Items) != n {
			return fmt.Errorf("list returned %d Books, want %d", len(l.Items), n)
		}
	}
	slices.Sort(full)
	step.ListMs = ms(full[1])
	return nil
}

func measurePagedList(ctx context.Context, c client.Client, ns string, n int, step *ScaleStep) error {
	t := time.Now()
	cont, got := "", 0
	for {
		var l libraryv1alpha1.BookList
		if err := c.List(ctx, &l, client.InNamespace(ns), client.Limit(scalePageLimit), client.Continue(cont)); err != nil {
			return fmt.Errorf("listing Books in pages: %w", err)
		}
		got += len(l.Items)
		if cont = l.Continue; cont == "" {
			break
		}
	}
	step.PagedListMs = ms(time.Since(t))
	if got != n {
		return fmt.Errorf("paginated list returned %d Books, want %d", got, n)
	}
	return nil
}

type scaleCallResult struct {
	latencies []time.Duration
	errors    int
	firstErr  string
}

// scaleCalls makes n sequential Calls of a new Book each. A Call that fails is counted and
// the rest go on: at a large size a failure is a finding, not a reason to lose the others.
func scaleCalls(ctx context.Context, c client.WithWatch, ns, prefix string, n int) scaleCallResult {
	var r scaleCallResult
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		b := newBook(ns, fmt.Sprintf("%s-%d", prefix, i), "scale")
		d, err := timedCall(ctx, c, b)
		if err != nil {
			r.errors++
			if r.firstErr == "" {
				r.firstErr = fmt.Sprintf("call %s: %v", b.Name, err)
			}
			continue
		}
		r.latencies = append(r.latencies, d)
	}
	return r
}

// deleteNamespace deletes ns and waits, at most d, until it is gone.
func deleteNamespace(c client.Client, ns string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	if err := c.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting namespace %s: %w", ns, err)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		err := c.Get(ctx, client.ObjectKey{Name: ns}, obj)
		if apierrors.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("namespace %s still there after %s: %w", ns, d, ctx.Err())
		case <-tick.C:
		}
	}
}
