package webhook

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/google/go-github/v84/github"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
)

// Limits mirror the CRD schema, so a payload the API server would reject is refused with a
// 400 before anything is written.
var (
	repositoryRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+$`)
	shaRE        = regexp.MustCompile(`^[0-9a-f]{40}$`)
	actionRE     = regexp.MustCompile(`^[a-z][a-z_]{0,63}$`)
)

// zeroSHA is what GitHub sends as the head of a deleted branch.
const zeroSHA = "0000000000000000000000000000000000000000"

// change is what one delivery asks for: a PullRequest or Branch spec, and the Event that
// records the delivery.
type change struct {
	kind     string // "PullRequest" or "Branch"
	name     string // deterministic object name
	identity string // what the name stands for; a different identity under the name is a collision
	pr       *scmv1alpha1.PullRequestSpec
	branch   *scmv1alpha1.BranchSpec

	// at orders deliveries for one object: pull_request.updated_at, or for branches the
	// repository's pushed_at (see branchTime).
	at time.Time
	// untimed is set when the payload carried no usable time and at is the receive time.
	untimed bool

	reason  string // Event reason: PullRequestOpened, BranchCreated, ...
	action  string // Event action: the webhook action or event name
	message string // Event message for humans
}

// invalidPayload is a payload that parsed but cannot describe an object; the answer is 400.
type invalidPayload struct{ msg string }

func (e *invalidPayload) Error() string { return e.msg }

func invalid(format string, a ...any) error {
	return &invalidPayload{msg: fmt.Sprintf(format, a...)}
}

// ignored is a well-formed delivery the listener does not turn into an object (a tag, an
// event type it does not handle); the answer is 202 with the reason.
type ignored struct{ reason string }

func (e *ignored) Error() string { return "ignored: " + e.reason }

func checkRepository(r string) error {
	if r == "" {
		return invalid("repository.full_name is missing")
	}
	if len(r) > 140 || !repositoryRE.MatchString(r) {
		return invalid("repository.full_name %q is not owner/name", truncate(r, 160))
	}
	return nil
}

func checkBranch(b string) error {
	if b == "" {
		return invalid("branch name is empty")
	}
	if len(b) > 255 {
		return invalid("branch name is longer than 255 characters")
	}
	return nil
}

func checkSHA(field, sha string) error {
	if sha != "" && !shaRE.MatchString(sha) {
		return invalid("%s %q is not a 40-character lowercase hex commit SHA", field, truncate(sha, 80))
	}
	return nil
}

// camel turns a webhook action like ready_for_review into ReadyForReview for Event reasons.
func camel(action string) string {
	var b strings.Builder
	for _, part := range strings.Split(action, "_") {
		if part == "" {
			continue
		}
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	return b.String()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func short(sha string) string {
	if len(sha) > 7 {
		return sha[:7]
	}
	return sha
}

// pullRequestChange maps every pull_request action onto the PullRequest <owner>-<repo>-<number>.
func pullRequestChange(ev *github.PullRequestEvent) (*change, error) {
	pr := ev.GetPullRequest()
	if ev.PullRequest == nil {
		return nil, invalid("pull_request is missing")
	}
	action := ev.GetAction()
	if !actionRE.MatchString(action) {
		return nil, invalid("action %q is not a webhook action", truncate(action, 80))
	}
	repo := ev.GetRepo().GetFullName()
	if err := checkRepository(repo); err != nil {
		return nil, err
	}
	number := int64(pr.GetNumber())
	if number < 1 {
		number = int64(ev.GetNumber())
	}
	switch {
	case number < 1:
		return nil, invalid("pull_request.number is missing")
	case pr.GetID() < 1:
		return nil, invalid("pull_request.id is missing")
	case pr.GetUser().GetLogin() == "":
		return nil, invalid("pull_request.user.login is missing")
	case len(pr.GetUser().GetLogin()) > 100:
		return nil, invalid("pull_request.user.login is longer than 100 characters")
	case pr.UpdatedAt == nil || pr.GetUpdatedAt().IsZero():
		return nil, invalid("pull_request.updated_at is missing")
	}
	state := scmv1alpha1.PullRequestState(pr.GetState())
	if state != scmv1alpha1.PullRequestOpen && state != scmv1alpha1.PullRequestClosed {
		return nil, invalid("pull_request.state %q is neither open nor closed", truncate(pr.GetState(), 40))
	}
	head := pr.GetHead()
	if err := checkBranch(head.GetRef()); err != nil {
		return nil, invalid("pull_request.head.ref: %v", err)
	}
	if err := checkSHA("pull_request.head.sha", head.GetSHA()); err != nil {
		return nil, err
	}
	updated := metav1.NewTime(pr.GetUpdatedAt().UTC().Truncate(time.Second))
	spec := &scmv1alpha1.PullRequestSpec{
		User:       pr.GetUser().GetLogin(),
		Branch:     head.GetRef(),
		Status:     state,
		ID:         pr.GetID(),
		Repository: repo,
		Number:     number,
		HeadSHA:    head.GetSHA(),
		Merged:     pr.GetMerged(),
		LastAction: action,
		UpdatedAt:  &updated,
	}
	reason := "PullRequest" + camel(action)
	verb := strings.ReplaceAll(action, "_", " ")
	if action == "closed" && spec.Merged {
		reason, verb = "PullRequestMerged", "merged"
	}
	msg := fmt.Sprintf("pull request %s#%d %s by %s (%s, head %s)", repo, number, verb,
		ev.GetSender().GetLogin(), head.GetRef(), short(head.GetSHA()))
	if ev.GetSender().GetLogin() == "" {
		msg = fmt.Sprintf("pull request %s#%d %s (%s, head %s)", repo, number, verb, head.GetRef(), short(head.GetSHA()))
	}
	return &change{
		kind:     "PullRequest",
		name:     PullRequestName(repo, number),
		identity: pullRequestIdentity(repo, number),
		pr:       spec,
		at:       updated.Time,
		reason:   reason,
		action:   action,
		message:  msg,
	}, nil
}

// branchChange builds the Branch <owner>-<repo>-<branch> change shared by create, delete and
// push.
func branchChange(repo, branch string, state scmv1alpha1.BranchState, sha string, at *github.Timestamp, received time.Time) (*change, error) {
	if err := checkRepository(repo); err != nil {
		return nil, err
	}
	if err := checkBranch(branch); err != nil {
		return nil, err
	}
	if err := checkSHA("head sha", sha); err != nil {
		return nil, err
	}
	c := &change{kind: "Branch", name: BranchName(repo, branch), identity: branchIdentity(repo, branch)}
	if at == nil || at.IsZero() {
		c.at, c.untimed = received, true
	} else {
		c.at = at.UTC()
	}
	c.at = c.at.Truncate(time.Second)
	t := metav1.NewTime(c.at)
	c.branch = &scmv1alpha1.BranchSpec{Name: branch, State: state, Repository: repo, HeadSHA: sha, UpdatedAt: &t}
	return c, nil
}

// Branch deliveries carry no per-branch sequence number. The repository's pushed_at is the
// time of the latest push to any branch when GitHub rendered the payload; it never goes back,
// so it orders the deliveries of one branch (create and delete payloads carry it too). Two
// deliveries with the same second are applied in arrival order, unless one is a redelivery
// (see store.go). The head commit's timestamp is not used: it is when the commit was written,
// and a force-push to an older commit would look like going back in time.

func createChange(ev *github.CreateEvent, received time.Time) (*change, error) {
	if t := ev.GetRefType(); t != "branch" {
		return nil, &ignored{reason: refTypeReason(t)}
	}
	repo, branch := ev.GetRepo().GetFullName(), ev.GetRef()
	// A create payload has no SHA: the push delivery that accompanies it carries one.
	c, err := branchChange(repo, branch, scmv1alpha1.BranchCreated, "", ev.GetRepo().PushedAt, received)
	if err != nil {
		return nil, err
	}
	c.reason, c.action = "BranchCreated", "create"
	c.message = fmt.Sprintf("branch %s created in %s%s", branch, repo, by(ev.GetSender()))
	return c, nil
}

func deleteChange(ev *github.DeleteEvent, received time.Time) (*change, error) {
	if t := ev.GetRefType(); t != "branch" {
		return nil, &ignored{reason: refTypeReason(t)}
	}
	repo, branch := ev.GetRepo().GetFullName(), ev.GetRef()
	c, err := branchChange(repo, branch, scmv1alpha1.BranchDeleted, zeroSHA, ev.GetRepo().PushedAt, received)
	if err != nil {
		return nil, err
	}
	c.reason, c.action = "BranchDeleted", "delete"
	c.message = fmt.Sprintf("branch %s deleted in %s%s", branch, repo, by(ev.GetSender()))
	return c, nil
}

func pushChange(ev *github.PushEvent, received time.Time) (*change, error) {
	ref := ev.GetRef()
	if strings.HasPrefix(ref, "refs/tags/") {
		return nil, &ignored{reason: "tag"}
	}
	branch, ok := strings.CutPrefix(ref, "refs/heads/")
	if !ok {
		if ref == "" {
			return nil, invalid("ref is missing")
		}
		return nil, &ignored{reason: fmt.Sprintf("ref %s is not a branch", truncate(ref, 100))}
	}
	repo := ev.GetRepo().GetFullName()
	state, sha, verb := scmv1alpha1.BranchPushed, ev.GetAfter(), "pushed"
	switch {
	case ev.GetDeleted():
		state, sha, verb = scmv1alpha1.BranchDeleted, zeroSHA, "deleted by push"
	case ev.GetCreated():
		state, verb = scmv1alpha1.BranchCreated, "created by push"
	case ev.GetForced():
		verb = "force-pushed"
	}
	if sha == "" {
		return nil, invalid("after (the new head sha) is missing")
	}
	at := ev.GetRepo().PushedAt
	if at == nil || at.IsZero() {
		at = ev.GetHeadCommit().Timestamp
	}
	c, err := branchChange(repo, branch, state, sha, at, received)
	if err != nil {
		return nil, err
	}
	// The reason names the delivery, not the resulting state: a new branch produces a create
	// and a push delivery, and counting BranchCreated once per branch keeps the metric honest.
	c.reason, c.action = "BranchPushed", "push"
	c.message = fmt.Sprintf("branch %s of %s %s to %s%s", branch, repo, verb, short(sha), by(ev.GetPusher().GetName(), ev.GetSender()))
	return c, nil
}

func refTypeReason(t string) string {
	switch t {
	case "tag":
		return "tag"
	case "":
		return "ref_type is missing"
	default:
		return "ref_type " + truncate(t, 40)
	}
}

// by renders " by <login>" from the first non-empty of a pusher name or a sender.
func by(who ...any) string {
	for _, w := range who {
		switch w := w.(type) {
		case string:
			if w != "" {
				return " by " + w
			}
		case *github.User:
			if l := w.GetLogin(); l != "" {
				return " by " + l
			}
		}
	}
	return ""
}

// checkShape checks that a payload has the top-level fields of the event it is delivered as.
// X-GitHub-Event is not signed, and create and delete payloads parse alike: a captured create
// resent as a delete would mark its branch deleted. GitHub's create payload always carries
// master_branch and description (null when empty); its delete payload never does.
func checkShape(event string, payload []byte) error {
	if event != "create" && event != "delete" {
		return nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(payload, &top); err != nil {
		return invalid("payload is not a JSON object: %v", err)
	}
	_, master := top["master_branch"]
	_, desc := top["description"]
	switch {
	case event == "create" && (!master || !desc):
		return invalid("a create payload has master_branch and description; this one lacks them (a delete payload delivered as create?)")
	case event == "delete" && (master || desc):
		return invalid("a delete payload has no master_branch or description; this one has them (a create payload delivered as delete?)")
	}
	return nil
}
