package ipc_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/ipc"
)

func TestMain(m *testing.M) {
	testenv.Main(m)
}

type book = libraryv1alpha1.Book

func newBook(ns, name string) *book {
	return &book{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       libraryv1alpha1.BookSpec{Title: "Dune", Author: "Frank Herbert"},
	}
}

// receiver runs a Book receiver with handler h on its own manager until the
// test ends or stop is called; stop waits until the manager has stopped.
type receiver struct {
	mgr  ctrl.Manager
	stop func()
}

type managerOptions struct {
	leaderElection bool
	identity       string
}

func startReceiver(t *testing.T, h ipc.Handler[*book], ro ipc.Options, mo managerOptions) *receiver {
	t.Helper()
	env := testenv.Get(t)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                        scheme.Scheme,
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		LeaderElection:                mo.leaderElection,
		LeaderElectionID:              "ipc-test-" + strings.ToLower(t.Name()),
		LeaderElectionNamespace:       install.SystemNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 ptr.To(2 * time.Second),
		RenewDeadline:                 ptr.To(1500 * time.Millisecond),
		RetryPeriod:                   ptr.To(100 * time.Millisecond),
		// Several managers in one test binary register the same controller name.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if ro.Identity == "" {
		ro.Identity = mo.identity
	}
	if err := ipc.Register(mgr, &book{}, h, ro); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return &receiver{mgr: mgr, stop: stop}
}

var catalogue = ipc.HandlerFunc[*book](func(_ context.Context, b *book) (ipc.Result, error) {
	return ipc.Done("catalogued " + b.Spec.Title), nil
})

func await(t *testing.T, obj client.Object, timeout time.Duration) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return ipc.Await(ctx, testenv.Get(t).Client, obj, ipc.Ready)
}

// gone holds once obj is deleted, and otherwise says what keeps it.
func gone(t testing.TB, obj client.Object) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		err := testenv.Get(t).Client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if err != nil {
			return false, err
		}
		return false, fmt.Errorf("%s still exists (deletionTimestamp %v, finalizers %v)", obj.GetName(), obj.GetDeletionTimestamp(), obj.GetFinalizers())
	}
}

// writeStatus plays the receiver by hand, so a test controls exactly which
// generation a status claims to describe.
func writeStatus(t *testing.T, b *book, observed int64, status metav1.ConditionStatus, reason, msg string) {
	t.Helper()
	env := testenv.Get(t)
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(b), b); err != nil {
		t.Fatal(err)
	}
	b.Status.ObservedGeneration = observed
	meta.SetStatusCondition(&b.Status.Conditions, metav1.Condition{Type: conditions.TypeReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: observed})
	if err := env.Client.Status().Update(context.Background(), b); err != nil {
		t.Fatal(err)
	}
}

func TestAwaitIgnoresStatusOfOlderGeneration(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	b := newBook(ns, "stale")
	if err := env.Client.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	writeStatus(t, b, 1, metav1.ConditionTrue, conditions.ReasonSucceeded, "gen 1 done")
	if err := await(t, b.DeepCopy(), 5*time.Second); err != nil {
		t.Fatalf("await at generation 1: %v", err)
	}

	b.Spec.Title = "Dune Messiah"
	if err := env.Client.Update(ctx, b); err != nil {
		t.Fatal(err)
	}
	if b.Generation != 2 {
		t.Fatalf("generation after spec update = %d, want 2", b.Generation)
	}
	// Ready=True for generation 1 is still in the status: it must not end
	// the wait, neither as it stands nor when rewritten.
	waiter := b.DeepCopy()
	errc := make(chan error, 1)
	go func() { errc <- await(t, waiter, 20*time.Second) }()
	writeStatus(t, b, 1, metav1.ConditionTrue, conditions.ReasonSucceeded, "gen 1 done, again")
	stale := b.DeepCopy()
	if err := await(t, stale, 300*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("await with only a generation-1 status: got %v, want deadline exceeded", err)
	}
	select {
	case err := <-errc:
		t.Fatalf("await returned on a stale status: %v", err)
	default:
	}
	writeStatus(t, b, 2, metav1.ConditionTrue, conditions.ReasonSucceeded, "gen 2 done")
	if err := <-errc; err != nil {
		t.Fatalf("await after generation-2 status: %v", err)
	}
	if waiter.Status.ObservedGeneration != 2 || waiter.Generation != 2 {
		t.Fatalf("await returned object at generation %d observed %d, want 2/2", waiter.Generation, waiter.Status.ObservedGeneration)
	}
}

func TestRequestCompletesWhenReceiverStartsLater(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	b := newBook(ns, "early")
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		errc <- ipc.Call(ctx, env.Client, b, ipc.Ready)
	}()
	// Only once the request is durably stored does the receiver start.
	testenv.Eventually(t, 10*time.Second, "the request stored", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "early"}, &book{})
		return err == nil, err
	})
	startReceiver(t, catalogue, ipc.Options{}, managerOptions{})
	if err := <-errc; err != nil {
		t.Fatalf("call: %v", err)
	}
	if r := meta.FindStatusCondition(b.Status.Conditions, conditions.TypeReady); r == nil || r.Message != "catalogued Dune" {
		t.Fatalf("Ready condition = %+v, want the receiver's message", r)
	}
}

// sideEffect is an idempotent handler: it records the request in a ConfigMap
// (checking first), the way a real receiver creates an external resource.
type sideEffect struct {
	c        client.Client
	ns       string // Books of earlier tests may still exist: leave them be
	creates  atomic.Int32
	entered  chan struct{}
	blockOne atomic.Bool
}

func (s *sideEffect) Handle(ctx context.Context, b *book) (ipc.Result, error) {
	if b.Namespace != s.ns {
		return ipc.Done("not this test's"), nil
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: b.Namespace, Name: "effect-" + b.Name}}
	err := s.c.Get(ctx, client.ObjectKeyFromObject(cm), cm)
	if apierrors.IsNotFound(err) {
		err = s.c.Create(ctx, cm)
		if err == nil {
			s.creates.Add(1)
		}
	}
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return ipc.Result{}, err
	}
	if s.blockOne.CompareAndSwap(true, false) {
		// Crash point: the side effect happened, the reply was not written.
		close(s.entered)
		<-ctx.Done()
		return ipc.Result{}, ctx.Err()
	}
	return ipc.Done("effect recorded"), nil
}

func TestReceiverKilledMidRequestCompletesOnceAfterRestart(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	h := &sideEffect{c: env.Client, ns: ns, entered: make(chan struct{})}
	h.blockOne.Store(true)
	first := startReceiver(t, h, ipc.Options{}, managerOptions{})
	b := newBook(ns, "crash")
	if err := env.Client.Create(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("handler never ran")
	}
	first.stop()
	if got := b.DeepCopy(); await(t, got, 200*time.Millisecond) == nil {
		t.Fatal("request completed although its receiver was killed before replying")
	}

	startReceiver(t, h, ipc.Options{}, managerOptions{})
	if err := await(t, b, 20*time.Second); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	if n := h.creates.Load(); n != 1 {
		t.Fatalf("side effect created %d times, want 1", n)
	}
	var cms corev1.ConfigMapList
	if err := env.Client.List(context.Background(), &cms, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	effects := 0
	for _, cm := range cms.Items {
		if cm.Name == "effect-crash" {
			effects++
		}
	}
	if effects != 1 {
		t.Fatalf("%d effect ConfigMaps, want 1", effects)
	}
}

func TestTerminalFailureAndTimeout(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	startReceiver(t, ipc.HandlerFunc[*book](func(_ context.Context, b *book) (ipc.Result, error) {
		switch b.Spec.Title {
		case "refuse":
			return ipc.Result{}, ipc.Terminal("this library does not take %q", b.Spec.Title)
		case "wait":
			return ipc.Waiting(conditions.ReasonWaiting, "waiting for shelf space", 0), nil
		}
		return ipc.Done("ok"), nil
	}), ipc.Options{}, managerOptions{})

	refused := newBook(ns, "refused")
	refused.Spec.Title = "refuse"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := ipc.Call(ctx, env.Client, refused, ipc.Ready)
	var terr *ipc.TerminalError
	if !errors.As(err, &terr) {
		t.Fatalf("call of a refused request: got %v, want *ipc.TerminalError", err)
	}
	if terr.Reason != conditions.ReasonFailed || terr.Message != `this library does not take "refuse"` || terr.Name != "refused" {
		t.Fatalf("terminal error = %+v", terr)
	}

	waiting := newBook(ns, "waiting")
	waiting.Spec.Title = "wait"
	short, cancelShort := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancelShort()
	if err := ipc.Call(short, env.Client, waiting, ipc.Ready); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call of a request that never finishes: got %v, want deadline exceeded", err)
	}
}

func TestTTLDeletesOnlyFinishedRequests(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	startReceiver(t, ipc.HandlerFunc[*book](func(_ context.Context, b *book) (ipc.Result, error) {
		if b.Name == "unfinished" {
			return ipc.Waiting(conditions.ReasonWaiting, "never done", 0), nil
		}
		return ipc.Done("ok"), nil
	}), ipc.Options{}, managerOptions{})
	ctx := context.Background()
	unfinished := newBook(ns, "unfinished")
	unfinished.Spec.TTLSecondsAfterFinished = ptr.To[int32](1)
	if err := env.Client.Create(ctx, unfinished); err != nil {
		t.Fatal(err)
	}
	finished := newBook(ns, "finished")
	finished.Spec.TTLSecondsAfterFinished = ptr.To[int32](1)
	callCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := ipc.Call(callCtx, env.Client, finished, ipc.Ready); err != nil {
		t.Fatal(err)
	}
	// It became Ready when its condition says, not when Call saw it (a write and a watch
	// later): the stored time is truncated to the second, so the TTL runs from the end of
	// that second and may end up to a second late, never early.
	ready := meta.FindStatusCondition(finished.Status.Conditions, conditions.TypeReady)
	if ready == nil {
		t.Fatalf("Call returned without a Ready condition: %+v", finished.Status)
	}
	earliest := ready.LastTransitionTime.Add(time.Second + time.Second)
	testenv.Eventually(t, 20*time.Second, "finished request with a 1 s TTL deleted", gone(t, finished))
	if seen := time.Now(); seen.Before(earliest) {
		t.Fatalf("finished request deleted by %v, before its 1 s TTL ran out at %v (Ready at %v)", seen, earliest, ready.LastTransitionTime)
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(unfinished), unfinished); err != nil {
		t.Fatalf("unfinished request with a TTL: %v (it must stay)", err)
	}
	if unfinished.Status.ObservedGeneration != 1 {
		t.Fatalf("unfinished request was not handled (observedGeneration %d)", unfinished.Status.ObservedGeneration)
	}
}

func TestLeaderElectionOnlyLeaderActsAndFailover(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	// Every handler call on this test's Books, in order. Books of earlier
	// tests may still exist; the receivers see them too, so they are ignored.
	type handled struct{ id, name string }
	var mu sync.Mutex
	var calls []handled
	handler := func(id string) ipc.Handler[*book] {
		return ipc.HandlerFunc[*book](func(_ context.Context, b *book) (ipc.Result, error) {
			if b.Namespace == ns {
				mu.Lock()
				calls = append(calls, handled{id, b.Name})
				mu.Unlock()
			}
			return ipc.Done("handled by " + id), nil
		})
	}
	a := startReceiver(t, handler("a"), ipc.Options{LeaseDuration: 3 * time.Second}, managerOptions{leaderElection: true, identity: "a"})
	b := startReceiver(t, handler("b"), ipc.Options{LeaseDuration: 3 * time.Second}, managerOptions{leaderElection: true, identity: "b"})
	leader, follower, leaderID, followerID := a, b, "a", "b"
	select {
	case <-a.mgr.Elected():
	case <-b.mgr.Elected():
		leader, follower, leaderID, followerID = b, a, "b", "a"
	case <-time.After(20 * time.Second):
		t.Fatal("no leader elected")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := newBook(ns, "first")
	if err := ipc.Call(ctx, env.Client, first, ipc.Ready); err != nil {
		t.Fatal(err)
	}
	if ok, err := ipc.ReceiverReady(ctx, env.Client, libraryv1alpha1.GroupVersion.WithKind("Book").GroupKind(), ""); err != nil || !ok {
		t.Fatalf("ReceiverReady with a leader running = %v, %v; want true", ok, err)
	}

	leader.stop()
	// Created while no replica leads: it must complete once the follower takes over.
	pending := newBook(ns, "pending")
	if err := ipc.Call(ctx, env.Client, pending, ipc.Ready); err != nil {
		t.Fatalf("pending request after leader stopped: %v", err)
	}
	select {
	case <-follower.mgr.Elected():
	default:
		t.Fatal("pending request completed but the follower was never elected")
	}

	// Only one replica acts at a time: every call by the first leader comes
	// before every call by the second (which re-checks what it finds:
	// handlers are idempotent). The first Book was handled by the leader,
	// the pending one by the follower.
	mu.Lock()
	defer mu.Unlock()
	seenFollower := false
	handledFirst, handledPending := false, false
	for _, h := range calls {
		switch {
		case h.id == followerID:
			seenFollower = true
			handledPending = handledPending || h.name == "pending"
		case seenFollower:
			t.Fatalf("%s acted after %s took over: %v", leaderID, followerID, calls)
		default:
			handledFirst = handledFirst || h.name == "first"
		}
	}
	if !handledFirst || !handledPending {
		t.Fatalf("first handled by the leader: %v, pending by the follower: %v; log %v", handledFirst, handledPending, calls)
	}
}

func TestReceiverReadyFollowsHeartbeat(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	gk := libraryv1alpha1.GroupVersion.WithKind("Book").GroupKind()
	r := startReceiver(t, catalogue, ipc.Options{LeaseDuration: 3 * time.Second}, managerOptions{identity: "hb"})
	testenv.Eventually(t, 10*time.Second, "a running receiver ready", func(ctx context.Context) (bool, error) {
		return ipc.ReceiverReady(ctx, env.Client, gk, "")
	})
	r.stop()
	// A clean stop clears the holder at once: no need to wait for expiry.
	if ok, err := ipc.ReceiverReady(ctx, env.Client, gk, ""); err != nil || ok {
		t.Fatalf("ReceiverReady after the receiver stopped = %v, %v; want false", ok, err)
	}
}

func TestAwaitSurvivesExpiredResourceVersion(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	b := newBook(ns, "expired")
	if err := env.Client.Create(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	writeStatus(t, b, 1, metav1.ConditionTrue, conditions.ReasonSucceeded, "done")
	// Revision 1 is far older than anything the API server's watch cache
	// keeps: the watch is refused with 410 Gone / Expired.
	stale := newBook(ns, "expired")
	stale.ResourceVersion = "1"
	if err := await(t, stale, 10*time.Second); err != nil {
		t.Fatalf("await from an expired resourceVersion: %v", err)
	}
}
