package webhook_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
	"github.com/crdipc/crdipc/internal/scm/webhook"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

func requestStrings(reqs []apiRequest) []string {
	var s []string
	for _, r := range reqs {
		s = append(s, r.String())
	}
	return s
}

// A new delivery costs the API server three writes, in this order: the object, its Event, and
// the body's Delivery record, created complete; and no read, the listener's cache answering
// for the record and the object. Counted on the wire of the listener's own client and cache.
func TestThreeWritesPerDelivery(t *testing.T) {
	h := newHarness(t, nil)
	// The first delivery also pays for the client's API discovery.
	h.mustDeliver("pull_request", deliveryA, "pull_request-opened.json", http.StatusOK)

	scm := "/apis/scm.crdipc.io/v1alpha1/namespaces/" + h.ns
	events := "/api/v1/namespaces/" + h.ns + "/events"
	var r reply
	got := requestStrings(h.during(func() {
		r = h.mustDeliver("pull_request", deliveryB, "pull_request-closed.json", http.StatusOK)
	}))
	want := []string{"POST " + scm + "/pullrequests", "POST " + events, "POST " + scm + "/deliveries"}
	if r.Result != "created" || !slices.Equal(got, want) {
		t.Errorf("a delivery of a new pull request (%s) sent the API server\n  %s\nwant three writes and no read:\n  %s",
			r.Result, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if rec := h.record(fixture(t, "pull_request-closed.json")); rec == nil || rec.Status.Result != "created" ||
		rec.Status.EventName != r.EventName || rec.Status.Object != "pullrequests/"+pr43 || rec.Status.CompletedAt == nil {
		t.Errorf("record written in one create: %+v", rec)
	}

	// A change to an object the cache holds: the same three, the first an update. (Right after
	// a write the cache may lag, and a stale read costs a conflict and a live read: wait for
	// the steady state, each attempt a later synchronize.)
	want = []string{"PUT " + scm + "/pullrequests/" + pr42, "POST " + events, "POST " + scm + "/deliveries"}
	minute := 20
	wait.Eventually(t, 30*time.Second, "an update costing three writes", func(context.Context) (bool, error) {
		minute++
		body := strings.Replace(string(fixture(t, "pull_request-synchronize.json")), "2026-03-02T10:20:00Z", fmt.Sprintf("2026-03-02T10:%02d:00Z", minute), 1)
		var r reply
		got := requestStrings(h.during(func() { r = h.deliver("pull_request", fmt.Sprintf("sync-%d", minute), []byte(body)) }))
		if r.Status != http.StatusOK || r.Result != "updated" {
			return false, fmt.Errorf("synchronize at minute %d: %d %+v", minute, r.Status, r)
		}
		if !slices.Equal(got, want) {
			return false, fmt.Errorf("an update sent\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
		}
		return true, nil
	})

	// A recorded body, once the cache holds its record, costs no request at all.
	wait.Eventually(t, 30*time.Second, "a redelivery costing nothing", func(context.Context) (bool, error) {
		var r reply
		got := h.during(func() { r = h.mustDeliver("pull_request", deliveryB, "pull_request-closed.json", http.StatusOK) })
		if r.Result != "duplicate" {
			return false, fmt.Errorf("redelivery: %+v", r)
		}
		if len(got) > 0 {
			return false, fmt.Errorf("a redelivery sent %s", strings.Join(requestStrings(got), ", "))
		}
		return true, nil
	})
}

// Two hooks on one repository send one body under two delivery IDs, at once: one Event, one
// record, one answer that stored it and the others duplicates.
func TestConcurrentCopiesUnderTwoIDs(t *testing.T) {
	bothModes(t, testConcurrentCopiesUnderTwoIDs)
}

func testConcurrentCopiesUnderTwoIDs(t *testing.T, h *harness) {
	for _, tc := range []struct{ event, file, object string }{
		{"pull_request", "pull_request-opened.json", "pullrequests/" + pr42},
		{"create", "create-branch.json", "branches/" + loginBranch},
	} {
		// One delivery ID names one body: each body's hooks have IDs of their own.
		hooks := []string{tc.file + "-hook-1", tc.file + "-hook-2", tc.file + "-hook-3"}
		body := fixture(t, tc.file)
		var wg sync.WaitGroup
		replies := make([]reply, 6)
		for i := range replies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies[i] = h.deliver(tc.event, hooks[i%2], body)
			}()
		}
		wg.Wait()
		results := map[string]int{}
		for _, r := range replies {
			if r.Status != http.StatusOK || r.Object != tc.object {
				t.Fatalf("%s: concurrent copy: %d %+v", tc.file, r.Status, r)
			}
			results[r.Result]++
		}
		// The copy that creates the Event reports what it found (created, or unchanged when
		// another copy's create landed first); the others are duplicates.
		if results["created"]+results["unchanged"] != 1 || results["duplicate"] != len(replies)-1 {
			t.Errorf("%s: concurrent results %v, want one created or unchanged and %d duplicates", tc.file, results, len(replies)-1)
		}
		evName := webhook.EventName(strings.Split(tc.object, "/")[1], webhook.RecordName(body))
		var evs []string
		for _, ev := range h.events() {
			if ev.InvolvedObject.Name == strings.Split(tc.object, "/")[1] {
				evs = append(evs, ev.Name)
			}
		}
		if !slices.Equal(evs, []string{evName}) {
			t.Errorf("%s: Events %v, want one, %s", tc.file, evs, evName)
		}
		rec := h.record(body)
		if rec == nil || rec.Status.Result == "" || rec.Status.EventName != evName || rec.Status.Object != tc.object ||
			(rec.Spec.DeliveryID != hooks[0] && rec.Spec.DeliveryID != hooks[1]) {
			t.Errorf("%s: record %+v", tc.file, rec)
		}
		// A third hook, later: a duplicate of the first.
		if r := h.mustDeliver(tc.event, hooks[2], tc.file, http.StatusOK); r.Result != "duplicate" || r.EventName != evName {
			t.Errorf("%s: a third copy: %+v", tc.file, r)
		}
	}
	if c := h.counts(); c != [3]int{1, 1, 2} {
		t.Errorf("after the copies: %v, want a PullRequest, a Branch and an Event each", c)
	}
}

// A body replayed as another event before the listener has any record of it (its record not
// yet in the cache, or the body older than the retention) writes nothing: every swap of the
// handled events either does not parse as the claimed event, is ignored, or is refused by its
// shape, before any write.
func TestSwappedEventWithoutRecord(t *testing.T) {
	h := newHarness(t, nil)
	handled := []string{"pull_request", "create", "delete", "push"}
	for _, tc := range []struct{ event, file string }{
		{"pull_request", "pull_request-opened.json"}, {"pull_request", "pull_request-synchronize.json"},
		{"pull_request", "pull_request-closed-merged.json"}, {"pull_request", "pull_request-closed.json"},
		{"pull_request", "pull_request-reopened.json"}, {"create", "create-branch.json"},
		{"delete", "delete-branch.json"}, {"push", "push.json"}, {"push", "push-created.json"}, {"push", "push-deleted.json"},
	} {
		for _, as := range handled {
			if as == tc.event {
				continue
			}
			var r reply
			writes := h.during(func() { r = h.deliver(as, "swap-"+as+"-"+tc.file, fixture(t, tc.file)) })
			if !(r.Status == http.StatusBadRequest || (r.Status == http.StatusAccepted && r.Result == "ignored")) || len(writes) > 0 {
				t.Errorf("%s delivered as %s: %d %+v, sent %v; want 400 or 202 ignored and no request", tc.file, as, r.Status, r, writes)
			}
			if h.record(fixture(t, tc.file)) != nil {
				t.Errorf("%s delivered as %s: recorded", tc.file, as)
			}
		}
	}
	if c := h.counts(); c != [3]int{} {
		t.Errorf("swapped replays wrote objects: %v", c)
	}
}

// A record an earlier listener left pending (it created the record first, then failed before
// completing its status) is completed by the next delivery of its body, for the delivery ID it
// names; and when that listener had stored the Event, under its name <object>.<delivery>, no
// second Event is written. A complete record cannot be changed.
func TestPendingRecordCompleted(t *testing.T) {
	bothModes(t, testPendingRecordCompleted)
}

// pending creates the record an earlier listener left pending for body, and returns once the
// listener's cache, if it has one, holds it.
func (h *harness) pending(event, delivery string, body []byte) *scmv1alpha1.Delivery {
	h.t.Helper()
	rec := &scmv1alpha1.Delivery{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: webhook.RecordName(body)},
		Spec:       scmv1alpha1.DeliverySpec{DeliveryID: delivery, Event: event, ReceivedAt: metav1.Now()},
	}
	if err := h.env.Client.Create(context.Background(), rec); err != nil {
		h.t.Fatalf("creating a pending record: %v", err)
	}
	wait.Eventually(h.t, 30*time.Second, "the listener's cache holding the pending record", func(ctx context.Context) (bool, error) {
		cached, synced := webhook.CachedRecord(ctx, h.l, rec.Name)
		return !synced || (cached != nil && cached.UID == rec.UID), nil
	})
	return rec
}

func testPendingRecordCompleted(t *testing.T, h *harness) {
	ctx := context.Background()
	// Nothing stored but the record: this delivery, under another ID, stores the object and
	// the Event for the recorded delivery and completes the record.
	opened := fixture(t, "pull_request-opened.json")
	rec := h.pending("pull_request", deliveryA, opened)
	r := h.mustDeliver("pull_request", deliveryB, "pull_request-opened.json", http.StatusOK)
	evName := webhook.EventName(pr42, webhook.RecordName(opened))
	if r.Result != "created" || r.EventName != evName {
		t.Errorf("delivery of a body with a pending record: %+v, want created with Event %s", r, evName)
	}
	if a := h.pullRequest(pr42).Annotations[webhook.DeliveryAnnotation]; a != deliveryA {
		t.Errorf("object annotated with delivery %q, want the recorded %s", a, deliveryA)
	}
	got := h.record(opened)
	if got == nil || got.UID != rec.UID || got.Spec.DeliveryID != deliveryA || !got.Spec.ReceivedAt.Equal(&rec.Spec.ReceivedAt) || got.Status.Result != "created" ||
		got.Status.EventName != evName || got.Status.Object != "pullrequests/"+pr42 || got.Status.CompletedAt == nil {
		t.Errorf("the pending record after the delivery: %+v, want it completed, its spec as it was", got)
	}

	// A complete record is immutable.
	changed := got.DeepCopy()
	changed.Status.Result = scmv1alpha1.DeliveryDuplicate
	if err := h.env.Client.Update(ctx, changed); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "a complete delivery record is immutable") {
		t.Errorf("changing a complete record: %v, want it refused as immutable", err)
	}

	// The Branch and its Event stored by an earlier listener, the Event named after the
	// delivery ID, and the record left pending: a redelivery writes nothing but the record.
	created := fixture(t, "create-branch.json")
	h.mustDeliver("create", deliveryC, "create-branch.json", http.StatusOK)
	if err := h.env.Client.Delete(ctx, h.record(created)); err != nil {
		t.Fatal(err)
	}
	var ev *corev1.Event
	for _, e := range h.events() {
		if e.InvolvedObject.Name == loginBranch {
			ev = &e
		}
	}
	if ev == nil {
		t.Fatal("no Event of the branch")
	}
	if err := h.env.Client.Delete(ctx, ev); err != nil {
		t.Fatal(err)
	}
	legacy := ev.DeepCopy()
	legacy.ObjectMeta = metav1.ObjectMeta{Namespace: h.ns, Name: loginBranch + "." + deliveryC, Annotations: ev.Annotations}
	if err := h.env.Client.Create(ctx, legacy); err != nil {
		t.Fatal(err)
	}
	h.pending("create", deliveryC, created)
	rv := h.branch(loginBranch).ResourceVersion
	r = h.mustDeliver("create", deliveryD, "create-branch.json", http.StatusOK)
	if r.Result != "duplicate" || r.EventName != legacy.Name {
		t.Errorf("delivery of a body stored by an earlier listener: %+v, want duplicate recorded on %s", r, legacy.Name)
	}
	if got := h.branch(loginBranch).ResourceVersion; got != rv {
		t.Errorf("the branch was rewritten: %s → %s", rv, got)
	}
	var names []string
	for _, e := range h.events() {
		if e.InvolvedObject.Name == loginBranch {
			names = append(names, e.Name)
		}
	}
	if !slices.Equal(names, []string{legacy.Name}) {
		t.Errorf("Events of the branch: %v, want the earlier listener's alone", names)
	}
	if got := h.record(created); got == nil || got.Spec.DeliveryID != deliveryC || got.Status.Result != "duplicate" || got.Status.EventName != legacy.Name {
		t.Errorf("record: %+v, want completed as a duplicate recorded on %s", got, legacy.Name)
	}
	var recs scmv1alpha1.DeliveryList
	if err := h.env.Client.List(ctx, &recs, client.InNamespace(h.ns)); err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs.Items {
		if rec.Status.Result == "" {
			t.Errorf("record %s left pending", rec.Name)
		}
	}
}
