package webhook_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-github/v84/github"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
	"github.com/crdipc/crdipc/internal/scm/webhook"
	"github.com/crdipc/crdipc/internal/testenv"
)

const (
	repo       = "octo-org/hello-world"
	pr42       = "octo-org-hello-world-42"
	pr43       = "octo-org-hello-world-43"
	headSHA1   = "c4f1e0f8a3c0b4f2a6b9b9e0c2d3e4f5a6b7c8d9"
	headSHA2   = "7d2a9b1e5f3c4d6e8a0b2c4d6e8f0a1b3c5d7e9f"
	zeroSHA    = "0000000000000000000000000000000000000000"
	deliveryA  = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
	deliveryB  = "a4b0b3a0-1f2d-11f1-8e4b-3c2a1d9e0f11"
	deliveryC  = "b9c8d7e6-1f2d-11f1-8e4b-3c2a1d9e0f22"
	deliveryD  = "c1d2e3f4-1f2d-11f1-8e4b-3c2a1d9e0f33"
	deliveryE  = "d5e6f7a8-1f2d-11f1-8e4b-3c2a1d9e0f44"
	vecSecret  = "It's a Secret to Everybody"
	vecBody    = "Hello, World!"
	vecSig     = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	loginTopic = "feature/login"
)

var loginBranch = webhook.BranchName(repo, loginTopic)

// GitHub's published example (docs: "Validating webhook deliveries") verifies with the same
// helper the listener uses, and with the listener itself: the signature passes, and the body,
// which is not a JSON event, is refused as malformed rather than as unauthorized.
func TestGitHubTestVector(t *testing.T) {
	if err := github.ValidateSignature(vecSig, []byte(vecBody), []byte(vecSecret)); err != nil {
		t.Fatalf("GitHub's test vector does not verify: %v", err)
	}
	h := newHarness(t, nil, func(o *webhook.Options) { o.Secret = []byte(vecSecret) })
	req := h.request("ping", deliveryA, []byte(vecBody))
	req.Header.Set("X-Hub-Signature-256", vecSig)
	if r := h.do(req); r.Status != http.StatusBadRequest || !strings.Contains(r.Error, "malformed JSON") {
		t.Fatalf("vector body: got %d %q, want 400 malformed JSON (the signature verified)", r.Status, r.Error)
	}
	bad := []byte(vecSig)
	bad[len(bad)-1] = '6'
	req = h.request("ping", deliveryA, []byte(vecBody))
	req.Header.Set("X-Hub-Signature-256", string(bad))
	if r := h.do(req); r.Status != http.StatusUnauthorized {
		t.Fatalf("one digit off: got %d %q, want 401", r.Status, r.Error)
	}
	if c := h.counts(); c != [3]int{} {
		t.Fatalf("objects created: %v", c)
	}
}

func TestRefusesToStartWithoutSecret(t *testing.T) {
	cfg := testenv.Get(t).Config
	if _, err := webhook.New(webhook.Options{Config: cfg, Namespace: "default"}); err == nil || !strings.Contains(err.Error(), "secret") {
		t.Fatalf("New without secret: %v, want an error about the secret", err)
	}
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := webhook.LoadSecret(empty); err == nil {
		t.Fatal("LoadSecret of an empty file succeeded")
	}
	t.Setenv(webhook.SecretEnv, "")
	if _, err := webhook.LoadSecret(""); err == nil {
		t.Fatal("LoadSecret with no file and empty env succeeded")
	}
	t.Setenv(webhook.SecretEnv, "from-env")
	if s, err := webhook.LoadSecret(""); err != nil || string(s) != "from-env" {
		t.Fatalf("LoadSecret from env = %q, %v", s, err)
	}
	gen := filepath.Join(dir, "sub", "webhook-secret")
	s1, created, err := webhook.EnsureSecretFile(gen)
	if err != nil || !created || len(s1) != 64 {
		t.Fatalf("EnsureSecretFile new = %q, %v, %v", s1, created, err)
	}
	s2, created, err := webhook.EnsureSecretFile(gen)
	if err != nil || created || string(s2) != string(s1) {
		t.Fatalf("EnsureSecretFile again = %q, %v, %v; want the same secret", s2, created, err)
	}
	if fi, err := os.Stat(gen); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("secret file mode: %v %v", fi, err)
	}
}

func TestPullRequestLifecycle(t *testing.T) {
	h := newHarness(t, nil)
	r := h.mustDeliver("pull_request", deliveryA, "pull_request-opened.json", http.StatusOK)
	// The Event is named after the body (its Delivery record), and says which delivery it was.
	evName := pr42 + "." + webhook.RecordName(fixture(t, "pull_request-opened.json"))
	if r.Result != "created" || r.Object != "pullrequests/"+pr42 || r.EventName != evName {
		t.Fatalf("opened: %+v, want created with Event %s", r, evName)
	}
	pr := h.pullRequest(pr42)
	want := scmv1alpha1.PullRequestSpec{User: "mona", Branch: loginTopic, Status: scmv1alpha1.PullRequestOpen, ID: 2061340011,
		Repository: repo, Number: 42, HeadSHA: headSHA1, LastAction: "opened"}
	checkPR(t, pr, want, "2026-03-02T10:06:00Z")
	if pr.Annotations[webhook.DeliveryAnnotation] != deliveryA {
		t.Errorf("delivery annotation = %q", pr.Annotations[webhook.DeliveryAnnotation])
	}
	evs := h.events()
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1", len(evs))
	}
	ev := evs[0]
	if ev.Name != evName || ev.Annotations[webhook.DeliveryAnnotation] != deliveryA || ev.Reason != "PullRequestOpened" || ev.Type != corev1.EventTypeNormal ||
		ev.Action != "opened" || ev.ReportingController != "crdipc.io/webhook-listener" || ev.ReportingInstance != "test-instance" ||
		ev.Count != 1 || ev.EventTime.IsZero() {
		t.Errorf("event: %+v", ev)
	}
	io := ev.InvolvedObject
	if io.APIVersion != "scm.crdipc.io/v1alpha1" || io.Kind != "PullRequest" || io.Name != pr42 || io.Namespace != h.ns || io.UID != pr.UID {
		t.Errorf("involvedObject = %+v, want the PullRequest %s (uid %s)", io, pr42, pr.UID)
	}
	if !strings.Contains(ev.Message, "octo-org/hello-world#42 opened by mona") {
		t.Errorf("message = %q", ev.Message)
	}

	h.mustDeliver("pull_request", deliveryB, "pull_request-synchronize.json", http.StatusOK)
	want.HeadSHA, want.LastAction = headSHA2, "synchronize"
	checkPR(t, h.pullRequest(pr42), want, "2026-03-02T10:20:00Z")

	r = h.mustDeliver("pull_request", deliveryC, "pull_request-closed-merged.json", http.StatusOK)
	want.Status, want.Merged, want.LastAction = scmv1alpha1.PullRequestClosed, true, "closed"
	checkPR(t, h.pullRequest(pr42), want, "2026-03-02T11:00:00Z")
	checkEventReason(t, h, r.EventName, "PullRequestMerged")

	h.mustDeliver("pull_request", deliveryD, "pull_request-closed.json", http.StatusOK)
	want43 := scmv1alpha1.PullRequestSpec{User: "mona", Branch: "fix_typo", Status: scmv1alpha1.PullRequestClosed, ID: 2061340099,
		Repository: repo, Number: 43, HeadSHA: "34c5c7793cb3b279e22454cb6750c80560547b3a", LastAction: "closed"}
	checkPR(t, h.pullRequest(pr43), want43, "2026-03-02T12:00:00Z")
	r = h.mustDeliver("pull_request", deliveryE, "pull_request-reopened.json", http.StatusOK)
	want43.Status, want43.LastAction = scmv1alpha1.PullRequestOpen, "reopened"
	checkPR(t, h.pullRequest(pr43), want43, "2026-03-02T12:30:00Z")
	checkEventReason(t, h, r.EventName, "PullRequestReopened")
	if n := len(h.events()); n != 5 {
		t.Fatalf("%d events after 5 deliveries, want 5", n)
	}
}

func checkPR(t *testing.T, pr *scmv1alpha1.PullRequest, want scmv1alpha1.PullRequestSpec, updated string) {
	t.Helper()
	got := pr.Spec
	if got.UpdatedAt == nil || got.UpdatedAt.UTC().Format(time.RFC3339) != updated {
		t.Errorf("%s updatedAt = %v, want %s", pr.Name, got.UpdatedAt, updated)
	}
	got.UpdatedAt = nil
	if got != want {
		t.Errorf("%s spec =\n %+v\nwant\n %+v", pr.Name, got, want)
	}
}

func checkEventReason(t *testing.T, h *harness, name, reason string) {
	t.Helper()
	for _, ev := range h.events() {
		if ev.Name == name {
			if ev.Reason != reason {
				t.Errorf("event %s reason %q, want %q", name, ev.Reason, reason)
			}
			return
		}
	}
	t.Errorf("no event %s", name)
}

func checkBranch(t *testing.T, b *scmv1alpha1.Branch, state scmv1alpha1.BranchState, sha, updated string) {
	t.Helper()
	if b.Spec.Name != loginTopic || b.Spec.Repository != repo || b.Spec.State != state || b.Spec.HeadSHA != sha ||
		b.Spec.UpdatedAt == nil || b.Spec.UpdatedAt.UTC().Format(time.RFC3339) != updated {
		t.Errorf("branch %s spec = %+v (updatedAt %v), want state %s head %s at %s", b.Name, b.Spec, b.Spec.UpdatedAt, state, sha, updated)
	}
}

func TestBranchLifecycle(t *testing.T) {
	h := newHarness(t, nil)
	if errs := validation.IsDNS1123Label(loginBranch); len(errs) > 0 || !strings.HasPrefix(loginBranch, "octo-org-hello-world-feature-login-") {
		t.Fatalf("branch name %q: %v", loginBranch, errs)
	}
	r := h.mustDeliver("create", deliveryA, "create-branch.json", http.StatusOK)
	if r.Object != "branches/"+loginBranch || r.Result != "created" {
		t.Fatalf("create: %+v", r)
	}
	checkBranch(t, h.branch(loginBranch), scmv1alpha1.BranchCreated, "", "2026-03-02T10:00:00Z")
	checkEventReason(t, h, r.EventName, "BranchCreated")

	// GitHub sends a push with created=true alongside; it adds the head SHA.
	h.mustDeliver("push", deliveryB, "push-created.json", http.StatusOK)
	checkBranch(t, h.branch(loginBranch), scmv1alpha1.BranchCreated, headSHA1, "2026-03-02T10:00:00Z")

	r = h.mustDeliver("push", deliveryC, "push.json", http.StatusOK)
	checkBranch(t, h.branch(loginBranch), scmv1alpha1.BranchPushed, headSHA2, "2026-03-02T10:20:00Z")
	checkEventReason(t, h, r.EventName, "BranchPushed")

	r = h.mustDeliver("delete", deliveryD, "delete-branch.json", http.StatusOK)
	checkBranch(t, h.branch(loginBranch), scmv1alpha1.BranchDeleted, zeroSHA, "2026-03-02T11:01:00Z")
	checkEventReason(t, h, r.EventName, "BranchDeleted")

	r = h.mustDeliver("push", deliveryE, "push-deleted.json", http.StatusOK)
	if r.Result != "unchanged" {
		t.Errorf("push deleted=true after delete: result %q, want unchanged", r.Result)
	}
	checkBranch(t, h.branch(loginBranch), scmv1alpha1.BranchDeleted, zeroSHA, "2026-03-02T11:01:00Z")
	if n := len(h.events()); n != 5 {
		t.Errorf("%d events, want one per delivery (5)", n)
	}

	// Tags are not branches: answered, counted, nothing written.
	before := h.counts()
	for _, tc := range []struct{ event, file string }{{"create", "create-tag.json"}, {"push", "push-tag.json"}} {
		r := h.mustDeliver(tc.event, "tag-"+tc.event, tc.file, http.StatusAccepted)
		if r.Result != "ignored" || r.Message != "ignored: tag" {
			t.Errorf("%s: %+v, want ignored: tag", tc.file, r)
		}
	}
	if after := h.counts(); after != before {
		t.Errorf("tag deliveries wrote objects: %v → %v", before, after)
	}
}

func TestPingAndUnhandledEvents(t *testing.T) {
	h := newHarness(t, nil)
	if r := h.mustDeliver("ping", deliveryA, "ping.json", http.StatusOK); r.Result != "pong" || r.Message != "Design for failure." {
		t.Errorf("ping: %+v", r)
	}
	if r := h.mustDeliver("issues", deliveryB, "issues-opened.json", http.StatusAccepted); r.Result != "ignored" || !strings.Contains(r.Message, `"issues" is not handled`) {
		t.Errorf("issues: %+v", r)
	}
	if c := h.counts(); c != [3]int{} {
		t.Errorf("ping/issues wrote objects: %v", c)
	}
}

func TestRedelivery(t *testing.T) {
	bothModes(t, testRedelivery)
}

func testRedelivery(t *testing.T, h *harness) {
	first := h.mustDeliver("pull_request", deliveryA, "pull_request-opened.json", http.StatusOK)
	rv := h.pullRequest(pr42).ResourceVersion
	for i := range 4 {
		r := h.mustDeliver("pull_request", deliveryA, "pull_request-opened.json", http.StatusOK)
		if r.Result != "duplicate" || r.EventName != first.EventName {
			t.Errorf("redelivery %d: %+v, want duplicate of %s", i+1, r, first.EventName)
		}
	}
	if got := h.pullRequest(pr42).ResourceVersion; got != rv {
		t.Errorf("redeliveries rewrote the object: resourceVersion %s → %s", rv, got)
	}
	if n := len(h.events()); n != 1 {
		t.Errorf("%d events after 5 deliveries of one delivery ID, want 1", n)
	}

	// Five concurrent copies of the next delivery: one state, one Event.
	body := fixture(t, "pull_request-synchronize.json")
	var wg sync.WaitGroup
	replies := make([]reply, 5)
	for i := range replies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = h.deliver("pull_request", deliveryB, body)
		}()
	}
	wg.Wait()
	results := map[string]int{}
	for _, r := range replies {
		if r.Status != http.StatusOK {
			t.Fatalf("concurrent redelivery: %d %+v", r.Status, r)
		}
		results[r.Result]++
	}
	// Exactly one copy creates the Event; it reports what it found (updated, or unchanged when
	// another copy's update landed first). The copies that lose the Event race are duplicates,
	// whatever they wrote: their writes were the same idempotent write.
	if results["duplicate"] != 4 || results["updated"]+results["unchanged"] != 1 {
		t.Errorf("concurrent results %v, want one updated or unchanged and 4 duplicates", results)
	}
	pr := h.pullRequest(pr42)
	if pr.Spec.HeadSHA != headSHA2 || pr.Spec.LastAction != "synchronize" {
		t.Errorf("after concurrent synchronize: %+v", pr.Spec)
	}
	if n := len(h.events()); n != 2 {
		t.Errorf("%d events, want 2", n)
	}

	// A branch push redelivered concurrently, as GitHub's "Redeliver" does after a timeout.
	push := fixture(t, "push.json")
	for i := range replies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = h.deliver("push", deliveryC, push)
		}()
	}
	wg.Wait()
	for _, r := range replies {
		if r.Status != http.StatusOK {
			t.Fatalf("concurrent push: %d %+v", r.Status, r)
		}
	}
	checkBranch(t, h.branch(loginBranch), scmv1alpha1.BranchPushed, headSHA2, "2026-03-02T10:20:00Z")
	if n := len(h.events()); n != 3 {
		t.Errorf("%d events, want 3", n)
	}
}

func TestOutOfOrder(t *testing.T) {
	bothModes(t, testOutOfOrder)
}

func testOutOfOrder(t *testing.T, h *harness) {
	h.mustDeliver("pull_request", deliveryC, "pull_request-closed-merged.json", http.StatusOK)
	for _, tc := range []struct{ delivery, file string }{
		{deliveryA, "pull_request-opened.json"}, {deliveryB, "pull_request-synchronize.json"},
	} {
		r := h.mustDeliver("pull_request", tc.delivery, tc.file, http.StatusOK)
		if r.Result != "stale" {
			t.Errorf("late %s: result %q, want stale", tc.file, r.Result)
		}
	}
	pr := h.pullRequest(pr42)
	if pr.Spec.Status != scmv1alpha1.PullRequestClosed || !pr.Spec.Merged || pr.Spec.LastAction != "closed" || pr.Spec.HeadSHA != headSHA2 {
		t.Errorf("late deliveries regressed the pull request: %+v", pr.Spec)
	}
	// The late deliveries still happened: each has its Event, which says it changed nothing.
	evs := h.events()
	if len(evs) != 3 {
		t.Fatalf("%d events, want 3", len(evs))
	}
	for _, ev := range evs {
		if ev.Reason == "PullRequestOpened" && !strings.Contains(ev.Message, "object not changed") {
			t.Errorf("stale event message %q does not say the object was not changed", ev.Message)
		}
	}

	h.mustDeliver("delete", deliveryD, "delete-branch.json", http.StatusOK)
	for _, tc := range []struct{ event, delivery, file string }{
		{"push", "late-push", "push.json"}, {"create", "late-create", "create-branch.json"}, {"push", "late-push-created", "push-created.json"},
	} {
		if r := h.mustDeliver(tc.event, tc.delivery, tc.file, http.StatusOK); r.Result != "stale" {
			t.Errorf("late %s: %q, want stale", tc.file, r.Result)
		}
	}
	checkBranch(t, h.branch(loginBranch), scmv1alpha1.BranchDeleted, zeroSHA, "2026-03-02T11:01:00Z")
}

// Two deliveries in the same second are applied in arrival order, but a redelivery of the
// earlier one must not undo the later one.
func TestSameSecondRedelivery(t *testing.T) {
	bothModes(t, testSameSecondRedelivery)
}

func testSameSecondRedelivery(t *testing.T, h *harness) {
	h.mustDeliver("create", deliveryA, "create-branch.json", http.StatusOK)
	h.mustDeliver("push", deliveryB, "push-created.json", http.StatusOK)
	// Same second as the create; a different payload. A redelivery of the push-created.json
	// with another state must not win over a later delivery: make the later one a create.
	// Another create event of the branch in the same second: a body of its own (an identical
	// body is a replay of the first, answered from its record).
	again := strings.Replace(string(fixture(t, "create-branch.json")), `"login": "mona"`, `"login": "hubot"`, 1)
	if r := h.deliver("create", deliveryC, []byte(again)); r.Status != http.StatusOK || r.Result != "unchanged" {
		t.Errorf("create after push-created (same second): %d %q, want unchanged (head SHA kept)", r.Status, r.Result)
	}
	body := strings.Replace(string(fixture(t, "push-created.json")), `"created": true`, `"created": false`, 1)
	if r := h.deliver("push", deliveryD, []byte(body)); r.Status != http.StatusOK || r.Result != "updated" {
		t.Fatalf("same-second push: %d %+v", r.Status, r)
	}
	checkBranch(t, h.branch(loginBranch), scmv1alpha1.BranchPushed, headSHA1, "2026-03-02T10:00:00Z")
	// Redelivering deliveryB (created) now ties in time and differs; its Event exists, so it
	// is a duplicate and the later state stays.
	if r := h.mustDeliver("push", deliveryB, "push-created.json", http.StatusOK); r.Result != "duplicate" {
		t.Errorf("redelivery of an earlier same-second push: %q, want duplicate", r.Result)
	}
	checkBranch(t, h.branch(loginBranch), scmv1alpha1.BranchPushed, headSHA1, "2026-03-02T10:00:00Z")
}

// Repositories "a-b/c" and "a/b-c" sanitize to the same name; the second gets its own object.
func TestNameCollision(t *testing.T) {
	h := newHarness(t, nil)
	orig := string(fixture(t, "pull_request-opened.json"))
	one := strings.ReplaceAll(orig, `"full_name": "octo-org/hello-world"`, `"full_name": "octo-org/hello-world"`)
	two := strings.ReplaceAll(orig, `"full_name": "octo-org/hello-world"`, `"full_name": "octo/org-hello-world"`)
	r1 := h.deliver("pull_request", "d1", []byte(one))
	r2 := h.deliver("pull_request", "d2", []byte(two))
	if r1.Status != 200 || r2.Status != 200 || r1.Object == r2.Object {
		t.Fatalf("collision: %+v %+v", r1, r2)
	}
	if r1.Object != "pullrequests/"+pr42 || !strings.HasPrefix(r2.Object, "pullrequests/"+pr42+"-") {
		t.Errorf("objects %s and %s", r1.Object, r2.Object)
	}
	// Deterministic: the same repository keeps landing on its own object.
	if r := h.deliver("pull_request", "d3", []byte(strings.Replace(two, "2026-03-02T10:06:00Z", "2026-03-02T10:07:00Z", -1))); r.Object != r2.Object || r.Result != "updated" {
		t.Errorf("second delivery for the colliding repository: %+v, want updated %s", r, r2.Object)
	}
}

func TestNames(t *testing.T) {
	long := strings.Repeat("very-long-repository-name", 5)
	names := map[string]string{
		"pr":       webhook.PullRequestName("Octo-Org/Hello-World", 4),
		"dots":     webhook.PullRequestName("octo/hello.world", 4),
		"long":     webhook.PullRequestName("octo/"+long, 4),
		"slash":    webhook.BranchName("octo/hello", "feature/x"),
		"dash":     webhook.BranchName("octo/hello", "feature-x"),
		"upper":    webhook.BranchName("octo/hello", "Feature-X"),
		"underbar": webhook.BranchName("octo/hello", "feature_x"),
		"long-br":  webhook.BranchName("octo/"+long, "x"),
		"unicode":  webhook.BranchName("octo/hello", "fëature"),
		"onlyjunk": webhook.BranchName("octo/hello", "...."),
	}
	if names["pr"] != "octo-org-hello-world-4" || names["dash"] != "octo-hello-feature-x" {
		t.Errorf("plain names: %v", names)
	}
	seen := map[string]string{}
	for k, n := range names {
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			t.Errorf("%s: %q is not a DNS-1123 label: %v", k, n, errs)
		}
		if other, dup := seen[n]; dup {
			t.Errorf("%s and %s share name %q", k, other, n)
		}
		seen[n] = k
		ev := webhook.EventName(n, webhook.RecordName([]byte(`{"zen":"x"}`)))
		if errs := validation.IsDNS1123Subdomain(ev); len(errs) > 0 {
			t.Errorf("event name %q: %v", ev, errs)
		}
	}
	if webhook.PullRequestName("octo/hello", 4) != webhook.PullRequestName("octo/hello", 4) {
		t.Error("names are not deterministic")
	}
}

// bothModes runs a test with the listener's cache (as Run serves) and without (every read
// live), since the cache only saves reads and must not change a single answer.
func bothModes(t *testing.T, test func(*testing.T, *harness)) {
	t.Run("cache", func(t *testing.T) { test(t, newHarness(t, nil)) })
	t.Run("live", func(t *testing.T) { test(t, newUnstartedHarness(t, nil)) })
}
