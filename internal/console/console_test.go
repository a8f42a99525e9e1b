package console

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/scm/webhook"
	"github.com/crdipc/crdipc/internal/simnode"
	"github.com/crdipc/crdipc/ipc"
)

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func book(uid string, gen, observed int64, status metav1.ConditionStatus, reason string, transition time.Time) *libraryv1alpha1.Book {
	b := &libraryv1alpha1.Book{ObjectMeta: metav1.ObjectMeta{
		Namespace: "default", Name: "b-" + uid, UID: types.UID(uid), Generation: gen, CreationTimestamp: metav1.NewTime(t0),
	}}
	if status != "" {
		b.Status = libraryv1alpha1.BookStatus{ObservedGeneration: observed, Conditions: []metav1.Condition{{
			Type: conditions.TypeReady, Status: status, Reason: reason, LastTransitionTime: metav1.NewTime(transition),
		}}}
	}
	return b
}

func TestTrackerTimesWhatItSawStart(t *testing.T) {
	tr := newTracker()
	tr.observe("Book", book("a", 1, 0, "", "", t0), false, t0.Add(10*time.Millisecond))
	if r, _ := tr.oldestInFlight(1); len(r) != 1 || !r[0].Since.Equal(t0.Add(10*time.Millisecond)) {
		t.Fatalf("in flight = %+v, want it since the time it was first seen", r)
	}
	tr.observe("Book", book("a", 1, 1, metav1.ConditionFalse, conditions.ReasonReconciling, t0), false, t0.Add(20*time.Millisecond))
	done := book("a", 1, 1, metav1.ConditionTrue, conditions.ReasonSucceeded, t0.Add(time.Second))
	tr.observe("Book", done, false, t0.Add(57*time.Millisecond))
	tr.observe("Book", done, false, t0.Add(90*time.Millisecond)) // a later update: not a second completion
	got := tr.recent()
	if len(got) != 1 || got[0].LatencyMS != 47 || got[0].Approx || !got[0].Succeeded {
		t.Fatalf("completions = %+v, want one of 47 ms, measured", got)
	}
}

func TestTrackerFallsBackToTimestamps(t *testing.T) {
	tr := newTracker()
	// In the initial list, done: only the API's timestamps say how long it took.
	tr.observe("Book", book("old", 1, 1, metav1.ConditionTrue, conditions.ReasonSucceeded, t0.Add(2*time.Second)), true, t0.Add(time.Hour))
	// Stale status (observedGeneration behind): in flight, whatever Ready says.
	tr.observe("Book", book("stale", 2, 1, metav1.ConditionTrue, conditions.ReasonSucceeded, t0), false, t0.Add(time.Hour))
	// Terminal failure is a completion, not a success.
	tr.observe("Book", book("bad", 1, 1, metav1.ConditionFalse, conditions.ReasonInvalidSpec, t0.Add(time.Second)), true, t0.Add(time.Hour))
	got := tr.recent()
	if len(got) != 2 {
		t.Fatalf("completions = %+v, want old and bad", got)
	}
	if got[0].Name != "b-old" || got[0].LatencyMS != 2000 || !got[0].Approx || !got[0].At.Equal(t0.Add(2*time.Second)) {
		t.Errorf("newest completion = %+v, want b-old, ≈2000 ms at its transition", got[0])
	}
	if got[1].Name != "b-bad" || got[1].Succeeded || got[1].Reason != conditions.ReasonInvalidSpec {
		t.Errorf("second completion = %+v, want b-bad failed InvalidSpec", got[1])
	}
}

func TestTrackerRegressionIsNewWork(t *testing.T) {
	tr := newTracker()
	healthy := book("v", 1, 1, metav1.ConditionTrue, conditions.ReasonSucceeded, t0)
	tr.observe("CStorVolume", healthy, true, t0)
	tr.observe("CStorVolume", book("v", 1, 1, metav1.ConditionFalse, conditions.ReasonDegraded, t0), false, t0.Add(time.Minute))
	tr.observe("CStorVolume", healthy, false, t0.Add(time.Minute+3*time.Second))
	got := tr.recent()
	if len(got) != 2 || got[0].LatencyMS != 3000 || got[0].Approx {
		t.Fatalf("completions = %+v, want the rebuild timed at 3 s", got)
	}
	tr.forget("v")
	if len(tr.started) != 0 || len(tr.done) != 0 || len(tr.inFlight) != 0 {
		t.Fatal("forget kept state of a deleted request")
	}
}

func TestTrackerIsBounded(t *testing.T) {
	tr := newTracker()
	for i := range 3 * maxCompletions {
		tr.observe("Book", book(fmt.Sprint(i), 1, 1, metav1.ConditionTrue, conditions.ReasonSucceeded, t0.Add(time.Duration(i)*time.Second)), true, t0)
	}
	got := tr.recent()
	if len(got) != maxCompletions || got[0].Name != fmt.Sprintf("b-%d", 3*maxCompletions-1) {
		t.Fatalf("kept %d completions, newest %s; want %d, newest first", len(got), got[0].Name, maxCompletions)
	}
}

// The requests in flight are kept from the events, oldest first, without listing them:
// a completion, a terminal failure and a delete take a request out; a regression puts it
// back, timed from when it was seen.
func TestTrackerKeepsRequestsInFlight(t *testing.T) {
	tr := newTracker()
	tr.observe("Book", book("old", 1, 0, "", "", t0), true, t0.Add(time.Hour)) // pending since creation
	tr.observe("Book", book("new", 1, 1, metav1.ConditionFalse, conditions.ReasonReconciling, t0), false, t0.Add(2*time.Hour))
	tr.observe("Book", book("gone", 1, 0, "", "", t0), false, t0.Add(3*time.Hour))
	tr.observe("Book", book("ok", 1, 1, metav1.ConditionTrue, conditions.ReasonSucceeded, t0), true, t0)
	names := func() (out []string) {
		got, _ := tr.oldestInFlight(maxInFlight)
		for _, r := range got {
			out = append(out, r.Name)
		}
		return out
	}
	if got, total := tr.oldestInFlight(2); total != 3 || len(got) != 2 || got[0].Name != "b-old" || !got[0].Since.Equal(t0) ||
		got[0].Reason != conditions.ReasonPending || got[1].Name != "b-new" || !got[1].Since.Equal(t0.Add(2*time.Hour)) ||
		got[1].Reason != conditions.ReasonReconciling {
		t.Fatalf("two oldest of %d in flight = %+v, want b-old pending since its creation, then b-new reconciling since seen", total, got)
	}
	if got := names(); !slices.Equal(got, []string{"b-old", "b-new", "b-gone"}) {
		t.Fatalf("in flight = %v, want b-old, b-new, b-gone", got)
	}
	tr.forget("gone")
	tr.observe("Book", book("new", 1, 1, metav1.ConditionTrue, conditions.ReasonSucceeded, t0), false, t0.Add(2*time.Hour+time.Second))
	tr.observe("Book", book("old", 1, 1, metav1.ConditionFalse, conditions.ReasonInvalidSpec, t0), false, t0.Add(2*time.Hour+time.Second))
	if got := names(); len(got) != 0 {
		t.Fatalf("in flight = %v, want none: done, failed for good, deleted", got)
	}
	tr.observe("Book", book("ok", 1, 1, metav1.ConditionFalse, conditions.ReasonDegraded, t0), false, t0.Add(4*time.Hour))
	if got, _ := tr.oldestInFlight(maxInFlight); len(got) != 1 || got[0].Name != "b-ok" || !got[0].Since.Equal(t0.Add(4*time.Hour)) {
		t.Fatalf("in flight = %+v, want b-ok again, since the regression was seen", got)
	}
}

// What the console keeps of a Book says what the full one says to the tracker.
// The oldest n of many, in any map order, are the first n of them all sorted.
func TestOldestInFlightOfMany(t *testing.T) {
	tr := newTracker()
	var all []Request
	for i := range 500 {
		// Many share a Since: the names decide among them.
		b := book(fmt.Sprint(i), 1, 0, "", "", t0)
		b.CreationTimestamp = metav1.NewTime(t0.Add(time.Duration((i*7919)%97) * time.Second))
		tr.observe("Book", b, true, t0)
		all = append(all, Request{Kind: "Book", Namespace: b.Namespace, Name: b.Name, Reason: conditions.ReasonPending, Since: b.CreationTimestamp.Time})
	}
	slices.SortFunc(all, olderFirst)
	for _, n := range []int{0, 1, 50, 500, 501} {
		got, total := tr.oldestInFlight(n)
		if want := all[:min(n, len(all))]; total != len(all) || !slices.Equal(got, want) {
			t.Fatalf("oldest %d: %d of %d, first %v; want %v", n, len(got), total, got[:min(3, len(got))], want[:min(3, len(want))])
		}
	}
}

func TestSlimBook(t *testing.T) {
	full := book("a", 2, 2, metav1.ConditionTrue, conditions.ReasonSucceeded, t0.Add(time.Second))
	full.Annotations = map[string]string{"ipc.crdipc.io/call-id": "x", ipc.TraceParentAnnotation: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	full.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "m"}}
	full.Spec = libraryv1alpha1.BookSpec{Title: "Dune", Author: "Frank Herbert"}
	full.Status.Conditions = append(full.Status.Conditions, metav1.Condition{Type: "Progressing", Status: metav1.ConditionFalse})
	got, err := slimBook(full)
	if err != nil {
		t.Fatal(err)
	}
	slim := got.(*libraryv1alpha1.Book)
	if len(slim.Annotations) != 1 || slim.ManagedFields != nil || slim.Spec.Title != "" || len(slim.Status.Conditions) != 1 {
		t.Errorf("slim Book = %+v, want no annotations but the trace context, no managedFields, spec or other conditions", slim)
	}
	a, b := newTracker(), newTracker()
	a.observe("Book", full, true, t0.Add(time.Hour))
	b.observe("Book", slim, true, t0.Add(time.Hour))
	if ra, rb := a.recent(), b.recent(); len(ra) != 1 || fmt.Sprint(ra) != fmt.Sprint(rb) {
		t.Errorf("completions from the full Book %+v, from the slim one %+v", ra, rb)
	}
	tomb := toolscache.DeletedFinalStateUnknown{Key: "default/b-a", Obj: slim}
	if got, err := slimBook(tomb); err != nil || got != any(tomb) {
		t.Errorf("a tombstone came back as %v, %v; want it unchanged", got, err)
	}
}

func TestBuild(t *testing.T) {
	ready := []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	objs := []client.Object{
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{simnode.Label: "true"}}, Status: corev1.NodeStatus{Conditions: ready}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-2"}},
		&storagev1alpha1.CStorPool{ObjectMeta: metav1.ObjectMeta{Name: "c-node-1"}, Spec: storagev1alpha1.CStorPoolSpec{NodeName: "node-1", Claim: "c", Capacity: resource.MustParse("10Gi")},
			Status: storagev1alpha1.CStorPoolStatus{Phase: storagev1alpha1.PoolPhaseHealthy}},
		&storagev1alpha1.CStorPool{ObjectMeta: metav1.ObjectMeta{Name: "c-node-9"}, Spec: storagev1alpha1.CStorPoolSpec{NodeName: "node-9", Claim: "c"},
			Status: storagev1alpha1.CStorPoolStatus{Phase: storagev1alpha1.PoolPhaseOffline}},
		&storagev1alpha1.CStorVolumeReplica{ObjectMeta: metav1.ObjectMeta{Namespace: "crdipc-system", Name: "pvc-u1-c-node-1"},
			Spec:   storagev1alpha1.CStorVolumeReplicaSpec{Volume: "pvc-u1", Pool: "c-node-1", NodeName: "node-1"},
			Status: storagev1alpha1.CStorVolumeReplicaStatus{Phase: storagev1alpha1.ReplicaPhaseRebuilding, Rebuild: &storagev1alpha1.ReplicaRebuild{Source: "c-node-2", DoneBytes: 1, TotalBytes: 4}}},
		&storagev1alpha1.CStorVolume{ObjectMeta: metav1.ObjectMeta{Namespace: "crdipc-system", Name: "pvc-u1", UID: "v1", Generation: 1, CreationTimestamp: metav1.NewTime(t0),
			Annotations: map[string]string{"csi.crdipc.io/published": `{"node-1":"rw"}`}},
			Spec: storagev1alpha1.CStorVolumeSpec{Capacity: resource.MustParse("64Mi"), ReplicationFactor: 3},
			Status: storagev1alpha1.CStorVolumeStatus{ObservedGeneration: 1, Phase: storagev1alpha1.VolumePhaseDegraded, ReadyReplicas: 2, DesiredReplicas: 3,
				Conditions: []metav1.Condition{{Type: conditions.TypeReady, Status: metav1.ConditionFalse, Reason: conditions.ReasonDegraded, Message: "2 of 3 replicas healthy"}}}},
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "data", UID: "u1"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "writer"},
			Spec:   corev1.PodSpec{NodeName: "node-1", Volumes: []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning}},
		&corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pr.d1", Annotations: map[string]string{webhook.DeliveryAnnotation: "d1"}},
			Reason: "PullRequestOpened", InvolvedObject: corev1.ObjectReference{Kind: "PullRequest", Name: "pr"}, EventTime: metav1.NewMicroTime(t0)},
		&corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "pr.d2", Annotations: map[string]string{webhook.DeliveryAnnotation: "d2"}},
			Reason: "PullRequestClosed", InvolvedObject: corev1.ObjectReference{Kind: "PullRequest", Name: "pr"}, EventTime: metav1.NewMicroTime(t0.Add(time.Second))},
		&storagev1alpha1.VolumeBackup{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "nightly", Generation: 1, CreationTimestamp: metav1.NewTime(t0)},
			Spec: storagev1alpha1.VolumeBackupSpec{Store: "offsite", Source: &storagev1alpha1.BackupSource{PersistentVolumeClaimName: "data"}},
			Status: storagev1alpha1.VolumeBackupStatus{ObservedGeneration: 1, Phase: storagev1alpha1.BackupUploading, Volume: "default/data", Node: "node-2",
				Size: ptr.To(resource.MustParse("64Mi")), BytesDone: 16 << 20, BytesUploaded: 3 << 20, Throughput: "40.0MiB/s",
				Conditions: []metav1.Condition{{Type: conditions.TypeReady, Status: metav1.ConditionFalse, Reason: "Uploading", Message: "uploading from node node-2"}}}},
	}
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(objs...).Build()
	tr := newTracker()
	for _, o := range objs { // as the request kinds' informers would, in their first list
		gvk, err := apiutil.GVKForObject(o, scheme.Scheme)
		if err != nil {
			t.Fatal(err)
		}
		if r, ok := o.(conditions.Object); ok && slices.ContainsFunc(requestKinds, func(k requestKind) bool { return k.kind == gvk.Kind }) {
			tr.observe(gvk.Kind, r, true, t0)
		}
	}
	s, err := build(context.Background(), c, tr, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Nodes) != 3 || s.Nodes[0].Name != "node-1" || !s.Nodes[0].Ready || !s.Nodes[0].Simulated || s.Nodes[1].Ready || !s.Nodes[2].Gone {
		t.Errorf("nodes = %+v, want node-1 ready and simulated, node-2 not ready, node-9 gone", s.Nodes)
	}
	p := s.Nodes[0].Pools
	if len(p) != 1 || p[0].Phase != "Healthy" || len(p[0].Replicas) != 1 {
		t.Fatalf("node-1 pools = %+v, want c-node-1 with its replica", p)
	}
	if r := p[0].Replicas[0]; r.Phase != "Rebuilding" || r.Rebuild == nil || r.Rebuild.Percent != 25 {
		t.Errorf("replica = %+v, want Rebuilding at 25%%", r)
	}
	if len(s.Volumes) != 1 {
		t.Fatalf("volumes = %+v", s.Volumes)
	}
	v := s.Volumes[0]
	if v.Claim != "default/data" || len(v.Users) != 1 || v.Users[0].Node != "node-1" || v.Ready != 2 || v.Desired != 3 || len(v.Published) != 1 {
		t.Errorf("volume = %+v, want claim default/data used by writer on node-1, 2/3, published on node-1", v)
	}
	if len(s.InFlight) != 2 || !slices.ContainsFunc(s.InFlight, func(r Request) bool { return r.Kind == "CStorVolume" && r.Reason == conditions.ReasonDegraded }) {
		t.Errorf("in flight = %+v, want the degraded volume", s.InFlight)
	}
	if len(s.Deliveries) != 2 || s.Deliveries[0].Delivery != "d2" {
		t.Errorf("deliveries = %+v, want d2 then d1", s.Deliveries)
	}
	if len(s.Backups) != 1 || s.Backups[0].Percent != 25 || s.Backups[0].Size != "64.0 MiB" || s.Backups[0].Uploaded != "3.0 MiB" || s.Backups[0].Phase != "Uploading" {
		t.Errorf("backups = %+v, want nightly uploading, 25%% of 64 MiB, 3 MiB uploaded", s.Backups)
	}
	if !slices.ContainsFunc(s.InFlight, func(r Request) bool { return r.Kind == "VolumeBackup" && r.Reason == "Uploading" }) {
		t.Errorf("in flight = %+v, want the backup too", s.InFlight)
	}
	if s.Completed == nil || s.PullRequests == nil || s.Networks == nil || s.Backups == nil {
		t.Error("empty lists must encode as [], not null: the page maps over them")
	}
}

func TestHubKeepsOnlyTheNewest(t *testing.T) {
	h := newHub()
	h.publish([]byte("1"))
	ch, cancel, ok := h.subscribe()
	if !ok {
		t.Fatal("subscribe refused")
	}
	defer cancel()
	h.publish([]byte("2"))
	h.publish([]byte("3"))
	h.publish([]byte("3")) // unchanged: not sent again
	if got := string(<-ch); got != "3" {
		t.Fatalf("a slow subscriber got %q, want only the newest, 3", got)
	}
	select {
	case b := <-ch:
		t.Fatalf("unexpected %q", b)
	default:
	}
	for range maxClients - 1 {
		if _, _, ok := h.subscribe(); !ok {
			t.Fatal("refused below maxClients")
		}
	}
	if _, _, ok := h.subscribe(); ok {
		t.Fatal("accepted beyond maxClients")
	}
}

func testConsole(t *testing.T) (*Console, *httptest.Server) {
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		t.Fatal(err)
	}
	c := &Console{hub: newHub(), files: http.FileServerFS(static)}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	return c, srv
}

func TestServesPageWithoutExternalResources(t *testing.T) {
	_, srv := testConsole(t)
	for _, path := range []string{"/", "/console.js", "/console.css"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || len(body) == 0 {
			t.Fatalf("GET %s: %s", path, resp.Status)
		}
		// Offline machines: nothing may be loaded from elsewhere.
		if m := regexp.MustCompile(`(src|href|url)\s*[=(]\s*["']?(https?:)?//`).Find(body); m != nil {
			t.Errorf("%s loads an external resource: %s", path, m)
		}
	}
	resp, err := http.Get(srv.URL + "/state")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("GET /state before the first snapshot: %s, want 503", resp.Status)
	}
}

func TestEventsStreamSnapshots(t *testing.T) {
	c, srv := testConsole(t)
	c.hub.publish([]byte(`{"n":1}`))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/events", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	next := func() string {
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				return d
			}
		}
		t.Fatalf("stream ended: %v", sc.Err())
		return ""
	}
	if got := next(); got != `{"n":1}` {
		t.Fatalf("first message %q, want the snapshot at connect", got)
	}
	c.hub.publish([]byte(`{"n":2}`))
	if got := next(); got != `{"n":2}` {
		t.Fatalf("second message %q", got)
	}
}
