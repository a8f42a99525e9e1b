package metricsagent_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/crdipc/crdipc/internal/scm/metricsagent"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// The test: stop the agent, 50 Events, start it: exactly +50, per series too, at the
// first scrape after it is ready. Then a re-list adds nothing twice, and a restart with no
// new Events changes nothing.
func TestCountsEventsCreatedWhileDown(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	s := newSender(t, env.Config, ns)
	first := startAgent(t, nil, ns)
	s.send("pull_request", pullRequest(t, 1, "opened", "open", false, 1))
	s.send("pull_request", pullRequest(t, 2, "opened", "open", false, 2))
	s.send("push", push(t, "main", 3, false, false))
	waitTotal(t, first, 3)
	before := eventSeries(t, first)
	first.stop()
	if _, total := checkpoint(t, ns); total != 3 {
		t.Fatalf("checkpoint after a graceful stop holds %v, want the 3 counted", total)
	}

	want := maps.Clone(before)
	for i := range 50 {
		if i%2 == 0 {
			s.send("pull_request", pullRequest(t, 1+i%3, "synchronize", "open", false, 10+i))
			want["PullRequest/PullRequestSynchronize/Normal"]++
		} else {
			s.send("push", push(t, fmt.Sprintf("b%d", i%4), 10+i, false, false))
			want["Branch/BranchPushed/Normal"]++
		}
	}

	// Through a proxy that can break the Event watch, to make it list again below.
	_, cfg := testenv.NewAPIProxy(t, agentConfig(t, ns))
	breaker := &watchBreaker{}
	cfg.Wrap(breaker.wrap)
	second := startAgentWith(t, ns, metricsagent.Options{Config: cfg})
	if got := eventSeries(t, second); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after the restart crdipc_scm_events_total is\n  %v\nwant the %v before it plus the 50 Events created meanwhile:\n  %v", got, before, want)
	}

	lists := second.metrics(t).Sum("crdipc_scm_agent_lists_total", map[string]string{"resource": "events"})
	breaker.expire()
	s.send("pull_request", pullRequest(t, 3, "opened", "open", false, 100))
	testenv.Eventually(t, 30*time.Second, "a re-list of events", func(context.Context) (bool, error) {
		if n := second.metrics(t).Sum("crdipc_scm_agent_lists_total", map[string]string{"resource": "events"}); n <= lists {
			return false, fmt.Errorf("%v lists of events, as before the watch expired", n)
		}
		return true, nil
	})
	waitTotal(t, second, 54)
	s.send("push", push(t, "main", 101, false, false)) // sentinel: exactly one more
	waitTotal(t, second, 55)
	final := eventSeries(t, second)
	second.stop()

	third := startAgent(t, nil, ns)
	if got := eventSeries(t, third); fmt.Sprint(got) != fmt.Sprint(final) {
		t.Fatalf("a restart with no new Events changed crdipc_scm_events_total from\n  %v\nto\n  %v", final, got)
	}
	s.send("push", push(t, "main", 102, false, false))
	waitTotal(t, third, 56)
}

// A crash loses the counts since the last checkpoint from the checkpoint, not from the
// count: the next agent counts those Events again from it, so its first value is exactly
// what the crashed agent had counted plus what happened while none ran.
func TestCrashResumesFromLastCheckpoint(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	s := newSender(t, env.Config, ns)
	first := startAgent(t, nil, ns)
	for i := range 4 {
		s.send("pull_request", pullRequest(t, 1+i, "opened", "open", false, i))
	}
	waitTotal(t, first, 4)
	first.stop()

	// With an hour's interval the second agent writes no checkpoint while it runs (when it
	// has synced there is nothing new), and its API server goes away before it stops: it ends
	// as a crash would, its 6 counted nowhere but in its memory.
	proxy, cfg := testenv.NewAPIProxy(t, agentConfig(t, ns))
	second := startAgentWith(t, ns, metricsagent.Options{Config: cfg, CheckpointInterval: time.Hour})
	holder, _ := checkpoint(t, ns)
	for i := range 6 {
		s.send("push", push(t, "main", 10+i, false, false))
	}
	waitTotal(t, second, 10)
	proxy.Down()
	second.stop()
	if h, total := checkpoint(t, ns); h != holder || total != 4 {
		t.Fatalf("checkpoint after the crash: holder %q, total %v; want the second agent's claim %q of the first's 4", h, total, holder)
	}

	for i := range 5 {
		s.send("pull_request", pullRequest(t, 1+i, "closed", "closed", i%2 == 0, 20+i))
	}
	// The third agent's lists of Events are held back: it has claimed the checkpoint and
	// holds its 4, lower than the 10 exported before the crash, which Prometheus would take
	// for a counter reset. Until it has handled a list it exports no count instead.
	release := make(chan struct{})
	cfg = rest.CopyConfig(agentConfig(t, ns))
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if strings.HasSuffix(req.URL.Path, "/events") {
				select {
				case <-release:
				case <-req.Context().Done():
					return nil, req.Context().Err()
				}
			}
			return rt.RoundTrip(req)
		})
	})
	third := serveAgent(t, ns, metricsagent.Options{Config: cfg})
	testenv.Eventually(t, 30*time.Second, "the third agent to claim the checkpoint", func(context.Context) (bool, error) {
		if h, _ := checkpoint(t, ns); h == holder {
			return false, fmt.Errorf("holder is still the crashed agent %q", h)
		}
		return true, nil
	})
	if mf := third.metrics(t)["crdipc_scm_events_total"]; mf != nil {
		t.Fatalf("exported before its first list of Events:\n%v", mf)
	}
	if ok, _ := wait.HTTPOK(third.URL + "/readyz")(context.Background()); ok {
		t.Fatal("/readyz is ok before the agent could list Events")
	}
	close(release)
	testenv.Eventually(t, 30*time.Second, "agent ready", wait.HTTPOK(third.URL+"/readyz"))
	if got := eventsTotal(t, third); got != 15 {
		t.Fatalf("after the crash crdipc_scm_events_total = %v, want the 10 counted before it + 5 created since", got)
	}
	s.send("push", push(t, "main", 30, false, false))
	waitTotal(t, third, 16)
}

// Two agents at once (a rollout overlap, a second replica): the one started last claims the
// checkpoint, the first one's next write conflicts and it stops writing, and the state the
// next agent resumes from is the newer agent's: nothing counted twice.
func TestNewerAgentTakesOverTheCheckpoint(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	s := newSender(t, env.Config, ns)
	fast := metricsagent.Options{CheckpointInterval: 50 * time.Millisecond}
	older := startAgentWith(t, ns, fast)
	s.send("pull_request", pullRequest(t, 1, "opened", "open", false, 1))
	s.send("push", push(t, "main", 2, false, false))
	waitTotal(t, older, 2)
	testenv.Eventually(t, 30*time.Second, "the older agent to checkpoint 2", func(context.Context) (bool, error) {
		if _, total := checkpoint(t, ns); total != 2 {
			return false, fmt.Errorf("checkpoint holds %v", total)
		}
		return true, nil
	})
	olderHolder, _ := checkpoint(t, ns)

	newer := startAgentWith(t, ns, fast)
	newerHolder, _ := checkpoint(t, ns)
	if newerHolder == olderHolder {
		t.Fatalf("the newer agent did not claim the checkpoint: holder still %q", olderHolder)
	}
	if got := eventsTotal(t, newer); got != 2 {
		t.Fatalf("newer agent starts at %v, want the checkpoint's 2", got)
	}
	for i := range 3 {
		s.send("pull_request", pullRequest(t, 2+i, "opened", "open", false, 3+i))
	}
	waitTotal(t, older, 5)
	waitTotal(t, newer, 5)
	superseded := func(a *runningAgent) float64 {
		return a.metrics(t).Sum("crdipc_scm_agent_checkpoint_writes_total", map[string]string{"result": "superseded"})
	}
	testenv.Eventually(t, 30*time.Second, "the older agent to stand down", func(context.Context) (bool, error) {
		if n := superseded(older); n != 1 {
			return false, fmt.Errorf("older agent: %v superseded writes", n)
		}
		return true, nil
	})
	testenv.Eventually(t, 30*time.Second, "the newer agent to checkpoint 5", func(context.Context) (bool, error) {
		if h, total := checkpoint(t, ns); h != newerHolder || total != 5 {
			return false, fmt.Errorf("checkpoint: holder %q, total %v", h, total)
		}
		return true, nil
	})
	if n := superseded(newer); n != 0 {
		t.Errorf("newer agent: %v superseded writes", n)
	}
	older.stop()
	if h, _ := checkpoint(t, ns); h != newerHolder {
		t.Fatalf("the older agent's shutdown wrote the checkpoint: holder %q", h)
	}

	s.send("push", push(t, "main", 10, false, false))
	waitTotal(t, newer, 6)
	newer.stop()
	last := startAgent(t, nil, ns)
	if got := eventsTotal(t, last); got != 6 {
		t.Fatalf("after both stopped the next agent starts at %v, want 6", got)
	}
}

// A checkpoint the agent cannot read stops it with an error that names it, rather than a
// silent reset of the counter; deleting it starts afresh.
func TestUnreadableCheckpointStopsTheAgent(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: metricsagent.DefaultCheckpointName},
		Data:       map[string]string{"format": "0", "note": "not written by this agent"},
	}
	if err := env.Client.Create(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
	a, err := metricsagent.New(metricsagent.Options{Config: agentConfig(t, ns), Namespace: ns, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = a.Start(ctx)
	if err == nil || !strings.Contains(err.Error(), ns+"/"+metricsagent.DefaultCheckpointName) || !strings.Contains(err.Error(), "delete it") {
		t.Fatalf("Start with an unreadable checkpoint: %v; want an error naming it and saying to delete it", err)
	}
	<-a.Stopped()

	if err := env.Client.Delete(context.Background(), cm); err != nil {
		t.Fatal(err)
	}
	s := newSender(t, env.Config, ns)
	s.send("push", push(t, "main", 1, false, false))
	b := startAgent(t, nil, ns)
	if got := eventsTotal(t, b); got != 0 {
		t.Fatalf("started afresh at %v, want 0 (existing Events are history)", got)
	}
	s.send("push", push(t, "main", 2, false, false))
	waitTotal(t, b, 1)
}
