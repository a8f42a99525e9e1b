package ipc_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/ipc"
)

// The tests in this file restart the whole control plane, which interrupts every
// client of the package's API server. Each leaves nothing behind that a later test
// would trip over: its receivers stop and its requests are deleted before it returns.

// TestAwaitSurvivesAPIServerRestart restarts the whole control plane while a
// sender waits: its watch breaks and the server is unreachable for seconds.
// Afterwards the object's resourceVersion is older than anything the new API
// server's watch cache holds, so Await must list to find where to watch from
// rather than retry the same expired watch in a tight loop.
func TestAwaitSurvivesAPIServerRestart(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	b := newBook(ns, "restart")
	if err := env.Client.Create(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	// A later write, so that the restarted server's watch cache starts past the
	// Book's resourceVersion: watching from it is then refused as expired.
	if err := env.Client.Create(context.Background(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "later"}}); err != nil {
		t.Fatal(err)
	}
	watcher := &expiryClient{WithWatch: env.Client}
	errc := make(chan error, 1)
	waiter := b.DeepCopy()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		errc <- ipc.Await(ctx, watcher, waiter, ipc.Ready)
	}()
	env.Restart(t)
	env = testenv.Get(t)
	// The waiter's resourceVersion has expired on the restarted server; once it
	// has found a newer one to watch from, the reply comes.
	testenv.Eventually(t, 20*time.Second, "the waiter watching the restarted API server", func(context.Context) (bool, error) {
		return watcher.expired.Load() > 0 && watcher.open.Load() > 0, nil
	})
	writeStatus(t, b, 1, metav1.ConditionTrue, conditions.ReasonSucceeded, "done after restart")
	if err := <-errc; err != nil {
		t.Fatalf("await across an API server restart: %v", err)
	}
	if r := meta.FindStatusCondition(waiter.Status.Conditions, conditions.TypeReady); r == nil || r.Message != "done after restart" {
		t.Fatalf("await returned %+v", r)
	}
	if n := watcher.again.Load(); n > 0 {
		t.Fatalf("the waiter watched %d times from a resourceVersion the server had refused as expired", n)
	}
}

// expiryClient watches through WithWatch and counts what a waiter does with
// expired resourceVersions: a retry from one (again) can only be refused again.
type expiryClient struct {
	client.WithWatch
	mu      sync.Mutex
	refused map[string]bool
	expired atomic.Int32 // watches refused with 410
	again   atomic.Int32 // watches started from an already refused resourceVersion
	open    atomic.Int32 // watches open now
}

func (c *expiryClient) Watch(ctx context.Context, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error) {
	o := (&client.ListOptions{}).ApplyOptions(opts)
	rv := ""
	if o.Raw != nil {
		rv = o.Raw.ResourceVersion
	}
	c.mu.Lock()
	if c.refused[rv] {
		c.again.Add(1)
	}
	c.mu.Unlock()
	refuse := func() {
		c.expired.Add(1)
		c.mu.Lock()
		if c.refused == nil {
			c.refused = map[string]bool{}
		}
		c.refused[rv] = true
		c.mu.Unlock()
	}
	w, err := c.WithWatch.Watch(ctx, list, opts...)
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		refuse()
	}
	if err != nil {
		return nil, err
	}
	c.open.Add(1)
	return &countedWatch{Interface: watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
		if ev.Type == watch.Error {
			if err := apierrors.FromObject(ev.Object); apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				refuse()
			}
		}
		return ev, true
	}), open: &c.open}, nil
}

type countedWatch struct {
	watch.Interface
	open *atomic.Int32
	once sync.Once
}

func (w *countedWatch) Stop() {
	w.once.Do(func() { w.open.Add(-1) })
	w.Interface.Stop()
}

// Requests labelled holdLabel=true wait until the ConfigMap releaseName
// appears in their namespace.
const (
	holdLabel   = "ipc-test/hold"
	releaseName = "release"
)

// ledger is the receiver of TestCallsSurviveAPIServerRestartUnderLoad. Its
// side effect, one ledger entry per request, is idempotent as the Handler
// contract asks: the receiver calls it again for a request it already served
// when the reply was lost (a status write cut off by the restart). Held
// requests wait, like a request waiting for another object, until the
// release ConfigMap appears.
type ledger struct {
	ns       string
	mu       sync.Mutex
	released bool
	calls    map[types.UID]int    // handler calls per request
	done     map[types.UID]int    // of those, calls that answered Done
	entries  map[types.UID]string // the side effect: request → name, made once
	held     map[types.NamespacedName]bool
}

func newLedger(ns string) *ledger {
	return &ledger{ns: ns, calls: map[types.UID]int{}, done: map[types.UID]int{}, entries: map[types.UID]string{}, held: map[types.NamespacedName]bool{}}
}

func (l *ledger) Handle(_ context.Context, b *book) (ipc.Result, error) {
	if b.Namespace != l.ns {
		return ipc.Done("not this test's"), nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls[b.UID]++
	if b.Labels[holdLabel] == "true" && !l.released {
		l.held[client.ObjectKeyFromObject(b)] = true
		// No RequeueAfter: the release ConfigMap's watch event wakes it.
		return ipc.Waiting(conditions.ReasonWaiting, "held until the control plane has restarted", 0), nil
	}
	if _, ok := l.entries[b.UID]; !ok {
		l.entries[b.UID] = b.Name
	}
	l.done[b.UID]++
	return ipc.Done("recorded " + b.Name), nil
}

// wake maps the release ConfigMap to every held request.
func (l *ledger) wake(_ context.Context, o client.Object) []reconcile.Request {
	if o.GetNamespace() != l.ns || o.GetName() != releaseName {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.released = true
	reqs := make([]reconcile.Request, 0, len(l.held))
	for k := range l.held {
		reqs = append(reqs, reconcile.Request{NamespacedName: k})
	}
	return reqs
}

func (l *ledger) seen() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.calls)
}

// TestCallsSurviveAPIServerRestartUnderLoad restarts the control plane under
// 1,000 concurrent Calls (issue 13): creates are cut off with their outcome
// unknown, watches break and expire, the receiver's status writes fail. Every
// Call must still return success once, for exactly one request object of its
// own, answered once: one Ready=True reply for generation 1, one Succeeded
// Event, one ledger entry.
func TestCallsSurviveAPIServerRestartUnderLoad(t *testing.T) {
	const calls = 1000
	env := testenv.Get(t)
	// Restart replaces env's clients; this one, like any client of a
	// restarted server, keeps working across it. env.Config is unthrottled.
	c := env.Client
	ns := env.Namespace(t)
	t.Cleanup(func() { deleteBooks(t, c, ns) })
	l := newLedger(ns)
	startReceiver(t, l, ipc.Options{
		MaxConcurrentReconciles: 8,
		LeaseDuration:           -1,
		Watches:                 []ipc.Watch{{Object: &corev1.ConfigMap{}, Map: l.wake}},
	}, managerOptions{})

	ctx, cancel := context.WithTimeout(context.Background(), 75*time.Second)
	defer cancel()
	sent := make([]*book, calls)
	errs := make([]error, calls)
	var returned atomic.Int32
	var wg sync.WaitGroup
	for i := range calls {
		b := newBook(ns, "")
		// Half the requests are named by the sender, half by generateName: a
		// create retried with a server-generated name would make a second object.
		if i%2 == 0 {
			b.Name = fmt.Sprintf("call-%04d", i)
		} else {
			b.GenerateName = "call-"
		}
		b.Labels = map[string]string{holdLabel: strconv.FormatBool(i%4 < 2)}
		sent[i] = b
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = ipc.Call(ctx, c, b, ipc.Ready)
			returned.Add(1)
		}()
	}
	testenv.Eventually(t, 30*time.Second, "100 requests stored and seen by the receiver", func(context.Context) (bool, error) {
		if n := l.seen(); n < 100 {
			return false, fmt.Errorf("%d seen", n)
		}
		return true, nil
	})
	if n := returned.Load(); n == calls {
		t.Fatal("every call returned before the restart: held requests were not held")
	}
	t.Logf("restarting with %d requests seen by the receiver and %d calls returned", l.seen(), returned.Load())
	restartStart := time.Now()
	env.Restart(t)
	t.Logf("control plane restarted in %v", time.Since(restartStart).Round(time.Millisecond))
	testenv.Eventually(t, 20*time.Second, "release ConfigMap created", func(ctx context.Context) (bool, error) {
		err := c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: releaseName}})
		return err == nil || apierrors.IsAlreadyExists(err), err
	})
	wg.Wait()
	t.Logf("all calls returned %v after the restart began", time.Since(restartStart).Round(time.Millisecond))

	var failed []error
	for i, err := range errs {
		if err != nil {
			failed = append(failed, fmt.Errorf("call %d (%s): %w", i, sent[i].Name, err))
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d calls failed, e.g. %v", len(failed), calls, errors.Join(failed[:min(len(failed), 5)]...))
	}
	// Each call returned its own object, answered for generation 1.
	byUID := map[types.UID]*book{}
	for _, b := range sent {
		r := meta.FindStatusCondition(b.Status.Conditions, conditions.TypeReady)
		if b.UID == "" || b.Generation != 1 || b.Status.ObservedGeneration != 1 || r == nil ||
			r.Status != metav1.ConditionTrue || r.ObservedGeneration != 1 || r.Message != "recorded "+b.Name {
			t.Fatalf("call for %s returned uid %q generation %d observed %d Ready %+v; want its own request answered for generation 1",
				b.Name, b.UID, b.Generation, b.Status.ObservedGeneration, r)
		}
		if other, dup := byUID[b.UID]; dup {
			t.Fatalf("calls for %s and %s returned the same request %s", other.Name, b.Name, b.UID)
		}
		byUID[b.UID] = b
	}
	// Exactly one object per call: none created twice, none left behind.
	var stored libraryv1alpha1.BookList
	if err := c.List(context.Background(), &stored, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(stored.Items) != calls {
		t.Errorf("%d requests stored for %d calls", len(stored.Items), calls)
	}
	for _, s := range stored.Items {
		b, ok := byUID[s.UID]
		if !ok {
			t.Errorf("request %s (%s) belongs to no call", s.Name, s.UID)
			continue
		}
		if s.Name != b.Name || s.Generation != 1 || s.Status.ObservedGeneration != 1 {
			t.Errorf("stored %s: name %s generation %d observed %d; want %s answered at generation 1", s.UID, s.Name, s.Generation, s.Status.ObservedGeneration, b.Name)
		}
	}
	// The side effect happened once per request, and only for the calls' requests.
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.entries) != calls {
		t.Errorf("%d ledger entries for %d calls", len(l.entries), calls)
	}
	again := 0
	for uid, name := range l.entries {
		if b, ok := byUID[uid]; !ok || b.Name != name {
			t.Errorf("ledger entry for %s (%s) belongs to no call", name, uid)
		}
		if l.done[uid] > 1 {
			again++
		}
	}
	t.Logf("%d requests answered Done more than once by the handler (at-least-once delivery; the ledger entry is made once)", again)
	// One Succeeded Event per request, however often its reply was written. The receiver
	// writes it after the status a Call returns on: wait until every request has one.
	succeeded := map[types.UID]int{}
	testenv.Eventually(t, 30*time.Second, "a Succeeded Event for every request", func(ctx context.Context) (bool, error) {
		var events corev1.EventList
		if err := c.List(ctx, &events, client.InNamespace(ns)); err != nil {
			return false, err
		}
		clear(succeeded)
		for _, ev := range events.Items {
			if ev.Reason == conditions.ReasonSucceeded && ev.InvolvedObject.Kind == "Book" {
				succeeded[ev.InvolvedObject.UID]++
			}
		}
		for uid := range byUID {
			if succeeded[uid] == 0 {
				return false, nil
			}
		}
		return true, nil
	})
	for uid, b := range byUID {
		if n := succeeded[uid]; n != 1 {
			t.Errorf("%s: %d Succeeded Events, want 1", b.Name, n)
		}
	}
}

// deleteBooks deletes a test's requests and waits until they are gone, so
// that the receivers of later tests, which see every namespace, do not
// start with them.
func deleteBooks(t *testing.T, c client.Client, ns string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "the test's requests deleted", func(ctx context.Context) (bool, error) {
		if err := c.DeleteAllOf(ctx, &book{}, client.InNamespace(ns)); err != nil {
			return false, err
		}
		var left libraryv1alpha1.BookList
		if err := c.List(ctx, &left, client.InNamespace(ns)); err != nil {
			return false, err
		}
		if len(left.Items) > 0 {
			return false, fmt.Errorf("%d requests left", len(left.Items))
		}
		return true, nil
	})
}
