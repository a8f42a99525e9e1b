package realnode

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/scm/delivery"
	"github.com/crdipc/crdipc/internal/scm/webhook"
)

// release is a released version of crdipc: CHANGELOG.md's heading and the commit its git
// tag v<version> marks.
type release struct{ version, commit string }

// releaseHeading is how CHANGELOG.md heads a released version: "## 0.2.0 (date, commit)".
var releaseHeading = regexp.MustCompile(`(?m)^## ([0-9]+\.[0-9]+\.[0-9]+) \([0-9]{4}-[0-9]{2}-[0-9]{2}, ([0-9a-f]{40})\)$`)

// previousRelease is the newest release CHANGELOG.md lists that is not VERSION. Its commit is
// the changelog's; where the tag exists (a clone may not carry tags), it must agree.
func previousRelease(t *testing.T) release {
	t.Helper()
	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	version := currentVersion(t)
	for _, m := range releaseHeading.FindAllStringSubmatch(string(changelog), -1) {
		if m[1] == version {
			continue
		}
		r := release{version: m[1], commit: m[2]}
		if tagged, err := runErr(time.Minute, nil, "git", "rev-parse", "-q", "--verify", "refs/tags/v"+r.version+"^{commit}"); err == nil && strings.TrimSpace(tagged) != r.commit {
			t.Fatalf("tag v%s is %s, CHANGELOG.md says %s", r.version, tagged, r.commit)
		}
		if out, err := runErr(time.Minute, nil, "git", "cat-file", "-e", r.commit+"^{commit}"); err != nil {
			t.Fatalf("release %s's commit %s is not in this clone (a shallow one?): %v %s", r.version, r.commit, err, out)
		}
		return r
	}
	t.Fatalf("CHANGELOG.md names no release before %s (a heading like \"## 0.2.0 (2026-11-28, <commit>)\")", version)
	return release{}
}

// buildRelease builds release r's image as its own make image does, from its files (git
// archive) in a directory of the user's cache, and returns that directory and the image.
// The Go build cache is shared: what did not change since r compiles no second time (its
// own packages do, their paths being others). A built image of the same commit is reused.
func buildRelease(t *testing.T, r release) (dir, image string) {
	t.Helper()
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	dir = filepath.Join(cache, "crdipc", "releases", r.version+"-"+r.commit[:12])
	image = filepath.Join(dir, "bin", "crdipc-image.tar")
	if _, err := os.Stat(image); err == nil {
		t.Logf("release %s's image: %s (built before)", r.version, image)
		return dir, image
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, 2*time.Minute, nil, "sh", "-c", fmt.Sprintf("git archive %s | tar -x -C %s", r.commit, dir))
	epoch := strings.TrimSpace(run(t, time.Minute, nil, "git", "log", "-1", "--format=%ct", r.commit))
	cmd := exec.Command("hack/image.sh")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+epoch)
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(image)
		t.Fatalf("release %s's hack/image.sh: %v\n%s", r.version, err, tail(string(out), 40))
	}
	return dir, image
}

// crdipcNamespaces are where crdipc's workloads run.
var crdipcNamespaces = []string{"crdipc-system", "crdipc-scm"}

// testUpgrade: the previous release's config/default on the three nodes, answering a Book,
// a PullRequest and a 3-replica volume a pod on real-1 writes to; then the upgrade in place
// as docs/deploy.md "Upgrading" gives it for that release. The writer never fails while
// everything but its own node's plugin is replaced, every record reads back on another
// node, leaders hand over to pods of the new image, no object loses a field, and the new
// version answers the old version's objects.
func (c *cluster) testUpgrade(t *testing.T, phase func(string)) {
	prev := previousRelease(t)
	dir, image := buildRelease(t, prev)
	phase(fmt.Sprintf("release %s's image (commit %.12s)", prev.version, prev.commit))
	for _, n := range c.joined {
		run(t, 5*time.Minute, nil, "hack/realnode.sh", "load", "--dir", n.dir(), "--image", image)
	}
	// As that release's docs/deploy.md applies it, forcing the conflicts with this version's
	// CRDs and roles, which the harness's up applied already (as crdipc-install and
	// crdipc-identity): the cluster is to be as that release left it.
	c.kubectl(t, "apply", "--server-side", "--force-conflicts", "-k", filepath.Join(dir, "config", "default"))
	// The webhook listener starts once its Secret exists.
	c.webhookSecret(t)
	c.rolledOut(t)
	phase(fmt.Sprintf("config/default of %s available", prev.version))

	// Requests the old version answers.
	c.apply(t, `apiVersion: library.crdipc.io/v1alpha1
kind: Book
metadata: {name: upgrade, namespace: default}
spec: {title: Great Expectations, author: Charles Dickens, isbn: 978-0-14-143956-3}
`)
	c.wait(t, 2*time.Minute, "--for=condition=Ready", "book/upgrade")
	pr := c.deliverPR(t, 7, false)
	c.kubectl(t, "apply", "-f", "config/samples/csi/storage_v1alpha1_storagepoolclaim.yaml")
	volume := c.threeReplicaClaim(t, "upgrade", "64Mi")
	// The objects as the old version left them, the volume not attached (after the
	// upgrade, too, it is compared detached: its target's status comes and goes with it).
	objects := []objectRef{
		{"book", "default", "upgrade"},
		{"pullrequest", "crdipc-scm", pr},
		{"storagepoolclaim", "", "sample-claim"},
		{"cstorvolume", "crdipc-system", volume},
		{"pvc", "default", "upgrade"},
		{"pv", "", volume},
	}
	before := c.getObjects(t, objects)
	on := nodeN(1)
	w := c.startWriter(t, "upgrade-writer", "upgrade", on)
	w.goOn(t, "the start", 50)
	leaders := c.leaseHolders(t)
	phase(fmt.Sprintf("%s answered a Book, a PullRequest; real-1 writing to a 3-replica volume", prev.version))

	// 1. Everything but the node plugins and the pool agents, which wait for their pods'
	// deletion (OnDelete).
	from := w.acked()
	c.kubectl(t, "apply", "--server-side", "-k", "config/upgrade/from-"+prev.version)
	c.rolledOut(t)
	w.goOn(t, "the apply of config/upgrade/from-"+prev.version, 20)
	phase(fmt.Sprintf("controllers, CRDs, fd holder upgraded; the writer's longest pause %s", w.longestPause(t, from)))

	// 2. Node by node, the writer's last: its pods with crdipc volumes drained, then its
	// plugin and agent replaced, once every volume is Healthy again.
	last := -1
	for _, n := range []realNode{nodeN(2), nodeN(3), on} {
		from := w.acked()
		if n == on {
			t.Cleanup(func() { c.kubectl(t, "uncordon", n.name) })
			c.drain(t, n, volume)
			last = w.acked()
			w.noFailure(t)
		}
		c.kubectl(t, "-n", "crdipc-system", "delete", "pod", "-l", "app.kubernetes.io/name in (crdipc-csi-node,crdipc-pool-agent)",
			"--field-selector", "spec.nodeName="+n.name, "--wait=true")
		c.poll(t, 5*time.Minute, "the new plugin and agent Ready on "+n.name, func() (bool, string) {
			out := c.kubectl(t, "-n", "crdipc-system", "get", "pods", "-l", "app.kubernetes.io/name in (crdipc-csi-node,crdipc-pool-agent)",
				"--field-selector", "spec.nodeName="+n.name, "-o", `jsonpath={range .items[*]}{.spec.containers[0].image} {.status.containerStatuses[0].ready}{"\n"}{end}`)
			lines := strings.Split(strings.TrimSpace(out), "\n")
			want := "crdipc/crdipc:" + currentVersion(t) + " true"
			return len(lines) == 2 && lines[0] == want && lines[1] == want, out
		})
		if n == on {
			c.kubectl(t, "uncordon", n.name)
			phase(fmt.Sprintf("%s drained after %d records, its plugin and agent replaced", n.name, last+1))
			continue
		}
		c.volumeHealthy(t, volume, "after "+n.name+"'s agent was replaced")
		w.goOn(t, n.name+"'s plugin and agent replaced", 20)
		phase(fmt.Sprintf("%s's plugin and agent replaced; the writer's longest pause %s", n.name, w.longestPause(t, from)))
	}
	c.readBack(t, "upgrade-reader", "upgrade", nodeN(3), last)
	c.volumeHealthy(t, volume, "after the upgrade")

	// 3. config/default as the harness block applies it: the DaemonSets roll again from
	// now on, and no pod restarts (their templates did not change).
	pods := c.podNames(t)
	c.doc.runThrough(t, 3*time.Minute, "kubectl apply --server-side -k config/default", c.describe)
	for _, ds := range []string{"crdipc-csi-node", "crdipc-pool-agent"} {
		if s := c.kubectl(t, "-n", "crdipc-system", "get", "daemonset", ds, "-o", "jsonpath={.spec.updateStrategy.type}"); s != "RollingUpdate" {
			t.Errorf("daemonset %s updates by %q after config/default, want RollingUpdate", ds, s)
		}
	}
	c.rolledOut(t)
	if now := c.podNames(t); !slices.Equal(now, pods) {
		t.Errorf("config/default after the upgrade replaced pods: before %v, after %v", pods, now)
	}
	phase(fmt.Sprintf("%d records read back on real-3; config/default applied", last+1))

	c.checkLeaders(t, leaders)
	after := c.getObjects(t, objects)
	for i, o := range objects {
		for _, lost := range lostFields(before[i], after[i]) {
			t.Errorf("%s %s lost %s in the upgrade", o.kind, o.name, lost)
		}
	}
	// The new version answers what the old one made: the pull request closes.
	c.deliverPR(t, 7, true)
	c.wait(t, time.Minute, "--for=condition=Ready", "book/upgrade")
	c.kubectl(t, "delete", "pvc", "upgrade", "--wait=true")
	phase("leaders handed over, no field lost, the old pull request closed by the new listener")
}

// currentVersion is VERSION, the image tag config/default deploys.
func currentVersion(t *testing.T) string {
	t.Helper()
	v, err := os.ReadFile(filepath.Join(root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(v))
}

// rolledOut waits for every Deployment and DaemonSet of crdipc (in namespaces, or all of
// crdipc's) to have each of its pods updated and available. kubectl rollout status knows
// only RollingUpdate; an OnDelete DaemonSet (the fd holder) is done when every pod it
// schedules is available.
func (c *cluster) rolledOut(t *testing.T, namespaces ...string) {
	t.Helper()
	if len(namespaces) == 0 {
		namespaces = crdipcNamespaces
	}
	for _, ns := range namespaces {
		for _, w := range strings.Fields(c.kubectl(t, "-n", ns, "get", "deployments,daemonsets", "-o", "name")) {
			if c.kubectl(t, "-n", ns, "get", w, "-o", "jsonpath={.spec.updateStrategy.type}") == "OnDelete" {
				c.poll(t, 4*time.Minute, w+" available on every node", func() (bool, string) {
					out := c.kubectl(t, "-n", ns, "get", w, "-o", "jsonpath={.status.desiredNumberScheduled} {.status.numberAvailable}")
					f := strings.Fields(out)
					return len(f) == 2 && f[0] != "0" && f[0] == f[1], "desired, available: " + out
				})
				continue
			}
			if out, err := runErr(6*time.Minute, c.env(), "kubectl", "-n", ns, "rollout", "status", w, "--timeout=6m"); err != nil {
				t.Fatalf("kubectl rollout status %s: %v\n%s\n%s", w, err, out, c.describe())
			}
		}
	}
}

// podNames are the names of crdipc's pods, sorted.
func (c *cluster) podNames(t *testing.T) []string {
	t.Helper()
	var names []string
	for _, ns := range crdipcNamespaces {
		names = append(names, strings.Fields(c.kubectl(t, "-n", ns, "get", "pods", "-o", "name"))...)
	}
	slices.Sort(names)
	return names
}

// webhookSecret creates the webhook listener's Secret, once, with a random key.
func (c *cluster) webhookSecret(t *testing.T) {
	t.Helper()
	if c.webhookKey != "" {
		return
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	key := hex.EncodeToString(secret)
	c.kubectl(t, "-n", "crdipc-scm", "create", "secret", "generic", "crdipc-webhook-secret", "--from-literal=secret="+key)
	c.webhookKey = key
	c.wait(t, 3*time.Minute, "--for=condition=Available", "deployment", "--all", "-n", "crdipc-scm")
}

// deliverPR sends testdata's pull_request-opened.json as pull request number, opened or
// (closed) closed two hours later, signed, to the webhook listener's Service, and waits for
// the PullRequest to have that state; it returns the PullRequest's name.
func (c *cluster) deliverPR(t *testing.T, number int, closed bool) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "internal/scm/webhook/testdata/pull_request-opened.json"))
	if err != nil {
		t.Fatal(err)
	}
	var event map[string]any
	if err := json.Unmarshal(raw, &event); err != nil {
		t.Fatal(err)
	}
	pr := event["pull_request"].(map[string]any)
	event["number"], pr["number"] = number, number
	action, state := "opened", "open"
	if closed {
		action, state = "closed", "closed"
		event["action"], pr["state"] = action, state
		pr["updated_at"], pr["closed_at"] = "2026-03-02T12:06:00Z", "2026-03-02T12:06:00Z"
	}
	body, err := json.Marshal(event)
	if err != nil {
		t.Fatal(err)
	}
	repository := event["repository"].(map[string]any)["full_name"].(string)
	url := "http://" + c.kubectl(t, "-n", "crdipc-scm", "get", "service", "crdipc-webhook-listener", "-o", "jsonpath={.spec.clusterIP}") + "/webhook"
	client := &http.Client{Timeout: 30 * time.Second}
	id := fmt.Sprintf("realnode-pull-request-%s-%d", action, number)
	// Until kube-proxy has the Service's new endpoints, it refuses: sending again is safe.
	c.poll(t, 2*time.Minute, "the listener answering pull request "+fmt.Sprint(number)+" "+action, func() (bool, string) {
		req, err := delivery.New(context.Background(), url, []byte(c.webhookKey), "pull_request", id, body)
		if err != nil {
			t.Fatal(err)
		}
		res, err := client.Do(req)
		if err != nil {
			return false, err.Error()
		}
		reply, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("delivery of pull request %d %s: %s %s", number, action, res.Status, reply)
		}
		return true, ""
	})
	name := webhook.PullRequestName(repository, int64(number))
	c.wait(t, time.Minute, "--for=jsonpath={.spec.status}="+state, "pullrequest/"+name, "-n", "crdipc-scm")
	return name
}

type objectRef struct{ kind, namespace, name string }

// getObjects is each object as the API server has it, decoded.
func (c *cluster) getObjects(t *testing.T, refs []objectRef) []map[string]any {
	t.Helper()
	objs := make([]map[string]any, len(refs))
	for i, r := range refs {
		args := []string{"get", r.kind, r.name, "-o", "json"}
		if r.namespace != "" {
			args = append(args, "-n", r.namespace)
		}
		if err := json.Unmarshal([]byte(c.kubectl(t, args...)), &objs[i]); err != nil {
			t.Fatalf("%s %s: %v", r.kind, r.name, err)
		}
	}
	return objs
}

// lostFields are the fields of before that after lacks, and the fields of before's spec whose
// value after changed. Lists are compared by their items' type or name where they have one
// (conditions), else by index; metadata the API server keeps (managedFields, resourceVersion)
// is left out.
func lostFields(before, after map[string]any) []string {
	flat := func(o map[string]any) map[string]any {
		m := map[string]any{}
		var walk func(path string, v any)
		walk = func(path string, v any) {
			switch v := v.(type) {
			case map[string]any:
				for k, e := range v {
					walk(path+"."+k, e)
				}
			case []any:
				for i, e := range v {
					key := fmt.Sprint(i)
					if item, ok := e.(map[string]any); ok {
						for _, k := range []string{"type", "name"} {
							if s, ok := item[k].(string); ok {
								key = k + "=" + s
								break
							}
						}
					}
					walk(path+"["+key+"]", e)
				}
			default:
				m[path] = v
			}
		}
		walk("", o)
		return m
	}
	b, a := flat(before), flat(after)
	var lost []string
	for path, v := range b {
		if strings.HasPrefix(path, ".metadata.managedFields") || path == ".metadata.resourceVersion" || path == ".metadata.generation" {
			continue
		}
		got, ok := a[path]
		switch {
		case !ok:
			lost = append(lost, path)
		case strings.HasPrefix(path, ".spec.") && fmt.Sprint(got) != fmt.Sprint(v):
			lost = append(lost, fmt.Sprintf("%s (was %v, now %v)", path, v, got))
		}
	}
	slices.Sort(lost)
	return lost
}

// leaseHolders are the Leases of crdipc's namespaces and who holds each.
func (c *cluster) leaseHolders(t *testing.T) map[string]string {
	t.Helper()
	holders := map[string]string{}
	for _, ns := range crdipcNamespaces {
		out := c.kubectl(t, "-n", ns, "get", "leases", "-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.holderIdentity}{"\n"}{end}`)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if name, holder, ok := strings.Cut(line, " "); ok && holder != "" {
				holders[ns+"/"+name] = holder
			}
		}
	}
	return holders
}

// checkLeaders: every Lease an old pod held is now held by a pod of the new image.
func (c *cluster) checkLeaders(t *testing.T, before map[string]string) {
	t.Helper()
	want := "crdipc/crdipc:" + currentVersion(t)
	handed := 0
	c.poll(t, 2*time.Minute, "every leader a pod of "+want, func() (bool, string) {
		images := map[string]string{} // pod → image
		for _, ns := range crdipcNamespaces {
			out := c.kubectl(t, "-n", ns, "get", "pods", "-o", `jsonpath={range .items[*]}{.metadata.name} {.spec.containers[0].image}{"\n"}{end}`)
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				if pod, image, ok := strings.Cut(line, " "); ok {
					images[pod] = image
				}
			}
		}
		now := c.leaseHolders(t)
		handed = 0
		for lease, old := range before {
			// controller-runtime's identity is <hostname: the pod's name>_<uuid>; the
			// others (a node's own leases) are not a Deployment's leader.
			if !strings.Contains(old, "_") {
				continue
			}
			holder, _, _ := strings.Cut(now[lease], "_")
			if images[holder] != want || now[lease] == old {
				return false, fmt.Sprintf("lease %s held by %q (image %q), before by %q", lease, now[lease], images[holder], old)
			}
			handed++
		}
		return true, ""
	})
	if handed == 0 {
		t.Errorf("no Lease of crdipc was held by a pod before the upgrade: %v", before)
	}
	t.Logf("%d leaders handed over to pods of %s", handed, want)
}
