package metricsagent_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
	"github.com/crdipc/crdipc/internal/scm/webhook"
	"github.com/crdipc/crdipc/internal/testenv"
)

// Events from before the agent started are history; each later occurrence is counted once,
// count updates add their difference, deletions add nothing.
func TestCountsEachOccurrenceOnce(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	s := newSender(t, env.Config, ns)
	s.send("pull_request", pullRequest(t, 1, "opened", "open", false, 1))
	s.send("pull_request", pullRequest(t, 2, "opened", "open", false, 2))
	s.send("push", push(t, "main", 3, false, false))

	a := startAgent(t, nil, ns)
	if got := eventsTotal(t, a); got != 0 {
		t.Fatalf("history counted: crdipc_scm_events_total = %v right after start, want 0", got)
	}

	s.send("pull_request", pullRequest(t, 1, "synchronize", "open", false, 4))
	s.send("pull_request", pullRequest(t, 2, "closed", "closed", true, 5))
	s.send("pull_request", pullRequest(t, 3, "opened", "open", false, 6))
	s.send("push", push(t, "main", 7, false, false))
	s.send("push", push(t, "main", 8, false, false)) // another push of the same branch: its own Event
	waitTotal(t, a, 5)
	mfs := a.metrics(t)
	for _, tc := range []struct {
		kind, reason string
		want         float64
	}{
		{"PullRequest", "PullRequestSynchronize", 1}, {"PullRequest", "PullRequestMerged", 1},
		{"PullRequest", "PullRequestOpened", 1}, {"Branch", "BranchPushed", 2},
	} {
		if got := mfs.Sum("crdipc_scm_events_total", map[string]string{"kind": tc.kind, "reason": tc.reason, "type": "Normal"}); got != tc.want {
			t.Errorf("crdipc_scm_events_total{kind=%q,reason=%q} = %v, want %v", tc.kind, tc.reason, got, tc.want)
		}
	}

	// A core/v1 writer that aggregates (kubelet-style) bumps count on the same Event.
	pr := &scmv1alpha1.PullRequest{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: webhook.PullRequestName("octo-org/hello-world", 1)}, pr); err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "aggregated"},
		InvolvedObject: corev1.ObjectReference{APIVersion: "scm.crdipc.io/v1alpha1", Kind: "PullRequest",
			Namespace: ns, Name: pr.Name, UID: pr.UID},
		Reason: "Checked", Message: "checked", Type: corev1.EventTypeWarning, Count: 1,
		FirstTimestamp: now, LastTimestamp: now, Source: corev1.EventSource{Component: "test"},
	}
	if err := env.Client.Create(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	waitTotal(t, a, 6)
	ev.Count = 4
	if err := env.Client.Update(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	waitTotal(t, a, 9)
	if got := a.metrics(t).Sum("crdipc_scm_events_total", map[string]string{"reason": "Other", "type": "Warning"}); got != 4 {
		t.Errorf("unknown reason: counted %v under reason=Other, want 4", got)
	}
	if err := env.Client.Delete(context.Background(), ev); err != nil {
		t.Fatal(err)
	}
	// Sentinel: one more delivery makes it exactly 10, so the deletion counted nothing.
	s.send("pull_request", pullRequest(t, 3, "labeled", "open", false, 8))
	waitTotal(t, a, 10)

	// Events about other kinds are not ours.
	other := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: ns, Name: "not-scm"},
		InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "ConfigMap", Namespace: ns, Name: "x"},
		Reason:         "Whatever", Type: corev1.EventTypeNormal, Count: 1, FirstTimestamp: now, LastTimestamp: now,
	}
	if err := env.Client.Create(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	s.send("pull_request", pullRequest(t, 3, "unlabeled", "open", false, 9))
	waitTotal(t, a, 11)
}

// A broken watch makes client-go list again; Events the agent has already counted are in that
// list and must not be counted again, and Events created while it was cut off are counted.
func TestRelistDoesNotDoubleCount(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	s := newSender(t, env.Config, ns)
	proxy, cfg := testenv.NewAPIProxy(t, env.Config)
	breaker := &watchBreaker{}
	cfg.Wrap(breaker.wrap)
	a := startAgent(t, cfg, ns)
	for i := range 5 {
		s.send("pull_request", pullRequest(t, 10+i, "opened", "open", false, i))
	}
	waitTotal(t, a, 5)
	listsOf := func() float64 {
		return a.metrics(t).Sum("crdipc_scm_agent_lists_total", map[string]string{"resource": "events"})
	}
	lists := listsOf()

	// The watch expires while deliveries go on: the agent lists all 5+3 Events again.
	for i := range 3 {
		if i == 1 {
			breaker.expire()
		}
		s.send("pull_request", pullRequest(t, 10+i, "synchronize", "open", false, 10+i))
	}
	testenv.Eventually(t, 30*time.Second, "a re-list of events", func(context.Context) (bool, error) {
		if n := listsOf(); n <= lists {
			return false, fmt.Errorf("%v lists of events, as before the watch expired", n)
		}
		return true, nil
	})
	waitTotal(t, a, 8)
	s.send("push", push(t, "main", 20, false, false))
	waitTotal(t, a, 9)

	// API server unreachable for a while: client-go resumes the watch where it was.
	proxy.Down()
	s.send("push", push(t, "main", 21, false, false))
	s.send("push", push(t, "main", 22, false, false))
	proxy.Up()
	waitTotal(t, a, 11)
	s.send("push", push(t, "main", 23, false, false))
	waitTotal(t, a, 12)
}

// Restarting the agent in the middle of a stream of deliveries: what the first agent
// counted continues in the second from the checkpoint, Events created while neither ran are
// counted by the second, and none is counted twice: the total is exactly the stream.
func TestRestartMidStream(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	s := newSender(t, env.Config, ns)
	first := startAgent(t, nil, ns)

	var sent atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if i%3 == 2 {
				s.send("push", push(t, fmt.Sprintf("b%d", i%5), 100+i, false, false))
			} else {
				s.send("pull_request", pullRequest(t, 100+i%7, "synchronize", "open", false, 100+i))
			}
			sent.Add(1)
		}
	}()
	atLeast := func(n int64) func(context.Context) (bool, error) {
		return func(context.Context) (bool, error) {
			if got := sent.Load(); got < n {
				return false, fmt.Errorf("%d deliveries sent", got)
			}
			return true, nil
		}
	}
	testenv.Eventually(t, 30*time.Second, "20 deliveries before the restart", atLeast(20))
	before := eventsTotal(t, first)
	first.stop()
	stopped := sent.Load()
	second := startAgent(t, nil, ns)
	started := sent.Load()
	testenv.Eventually(t, 30*time.Second, "20 deliveries after the restart", atLeast(started+20))
	close(stop)
	<-done
	n := float64(sent.Load())

	// Sentinel with a reason the stream never uses: the agent handles Events in the order the
	// API server stored them, so once the sentinel is counted every stream Event has been seen.
	s.send("pull_request", pullRequest(t, 1000, "closed", "closed", false, 1000))
	testenv.Eventually(t, 30*time.Second, "the sentinel to be counted", func(context.Context) (bool, error) {
		mfs := second.metrics(t)
		if n := mfs.Sum("crdipc_scm_events_total", map[string]string{"reason": "PullRequestClosed"}); n != 1 {
			return false, fmt.Errorf("%v PullRequestClosed counted; all:\n%s", n, mfs.Format("crdipc_scm_events_total"))
		}
		return true, nil
	})
	if total := eventsTotal(t, second); total != n+1 {
		t.Fatalf("crdipc_scm_events_total = %v after the restart, want the %v stream Events + 1 sentinel", total, n)
	}
	t.Logf("first agent counted %v before its stop; %d deliveries while no agent ran; %v in all", before, started-stopped, n)
}

// The gauges equal what `kubectl get` lists, and a new agent reports the same at once.
func TestGaugesMatchResources(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	s := newSender(t, env.Config, ns)
	a := startAgent(t, nil, ns)
	s.send("pull_request", pullRequest(t, 1, "opened", "open", false, 1))
	s.send("pull_request", pullRequest(t, 2, "opened", "open", false, 2))
	s.send("pull_request", pullRequest(t, 3, "closed", "closed", false, 3))
	s.send("pull_request", pullRequest(t, 4, "closed", "closed", true, 4))
	s.send("pull_request", pullRequest(t, 5, "closed", "closed", true, 5))
	s.send("push", push(t, "a", 1, true, false))
	s.send("push", push(t, "b", 2, false, false))
	s.send("push", push(t, "c", 3, false, true))
	s.send("push", push(t, "d", 4, false, false))

	want := func() map[string]float64 {
		var prs scmv1alpha1.PullRequestList
		var brs scmv1alpha1.BranchList
		if err := env.Client.List(context.Background(), &prs, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.List(context.Background(), &brs, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		m := map[string]float64{}
		for _, pr := range prs.Items {
			switch {
			case pr.Spec.Status == "open":
				m["pr/open"]++
			case pr.Spec.Merged:
				m["pr/merged"]++
			default:
				m["pr/closed"]++
			}
		}
		for _, b := range brs.Items {
			m["branch/"+string(b.Spec.State)]++
		}
		return m
	}
	got := func(a *runningAgent) map[string]float64 {
		mfs := a.metrics(t)
		m := map[string]float64{}
		for _, st := range []string{"open", "closed", "merged"} {
			if v := mfs.Sum("crdipc_scm_pullrequests", map[string]string{"state": st}); v > 0 {
				m["pr/"+st] = v
			}
		}
		for _, st := range []string{"created", "pushed", "deleted"} {
			if v := mfs.Sum("crdipc_scm_branches", map[string]string{"state": st}); v > 0 {
				m["branch/"+st] = v
			}
		}
		return m
	}
	expect := map[string]float64{"pr/open": 2, "pr/closed": 1, "pr/merged": 2, "branch/created": 1, "branch/pushed": 2, "branch/deleted": 1}
	if w := want(); fmt.Sprint(w) != fmt.Sprint(expect) {
		t.Fatalf("API lists %v, want %v", w, expect)
	}
	gaugesAre := func(want func() map[string]float64) func(context.Context) (bool, error) {
		return func(context.Context) (bool, error) {
			if g, w := got(a), want(); fmt.Sprint(g) != fmt.Sprint(w) {
				return false, fmt.Errorf("gauges %v, want %v", g, w)
			}
			return true, nil
		}
	}
	testenv.Eventually(t, 30*time.Second, "gauges to match the API", gaugesAre(func() map[string]float64 { return expect }))

	s.send("pull_request", pullRequest(t, 1, "closed", "closed", true, 10))
	expect["pr/open"], expect["pr/merged"] = 1, 3
	testenv.Eventually(t, 30*time.Second, "gauges to follow a merge", gaugesAre(want))

	a.stop()
	b := startAgent(t, nil, ns)
	if g, w := got(b), want(); fmt.Sprint(g) != fmt.Sprint(w) {
		t.Errorf("after restart the gauges are %v at first scrape, want %v", g, w)
	}
	// Every state is exported, even at zero, with no other labels.
	mfs := b.metrics(t)
	if n := len(mfs["crdipc_scm_pullrequests"].GetMetric()); n != 3 {
		t.Errorf("crdipc_scm_pullrequests has %d series, want 3", n)
	}
	for _, m := range mfs["crdipc_scm_branches"].GetMetric() {
		if len(m.GetLabel()) != 1 {
			t.Errorf("crdipc_scm_branches series with labels %v", m.GetLabel())
		}
	}
}
