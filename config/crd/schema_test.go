package crd_test

// These tests send custom resources to the real API server that internal/testenv starts once for
// this package (embedded etcd + kube-apiserver, with the embedded CRDs installed) and check what
// it accepts, rejects and defaults: OpenAPI schema, CEL rules (incl. transition rules) and
// defaulting are all the server's own. Objects are unstructured, decoded from YAML, so a test
// sees exactly what a user's `kubectl apply` would send and does not depend on the Go types.

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	bitcoinv1alpha1 "github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/config/crd"
	"github.com/crdipc/crdipc/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// Every embedded CRD is served with the scope it declares (testenv fails to start if the API
// server rejects one or it never becomes Established).
func TestCRDsServed(t *testing.T) {
	env := testenv.Get(t)
	crds, err := crd.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range crds {
		gk := schema.GroupKind{Group: c.Spec.Group, Kind: c.Spec.Names.Kind}
		var storage string
		for _, v := range c.Spec.Versions {
			if v.Storage {
				storage = v.Name
			}
		}
		m, err := env.Client.RESTMapper().RESTMapping(gk, storage)
		if err != nil {
			t.Errorf("%s: not served: %v", c.Name, err)
			continue
		}
		wantScope := meta.RESTScopeNameRoot
		if c.Spec.Scope == apiextensionsv1.NamespaceScoped {
			wantScope = meta.RESTScopeNameNamespace
		}
		if m.Scope.Name() != wantScope {
			t.Errorf("%s: served with scope %s, want %s", c.Name, m.Scope.Name(), wantScope)
		}
	}
}

// Every valid sample, one per kind, is accepted by the API server.
func TestSamples(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	crds, err := crd.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	var wantKinds []string
	for _, c := range crds {
		wantKinds = append(wantKinds, c.Spec.Names.Kind)
	}

	var kinds []string
	for _, dir := range []string{filepath.Join("..", "samples"), filepath.Join("..", "..", "test", "testdata", "operator-owned")} {
		files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			obj := decode(t, string(data))
			kinds = append(kinds, obj.GetKind())
			t.Run(filepath.Base(path), func(t *testing.T) {
				// `kubectl apply -f config/samples` must work without -n: namespaced samples
				// name their namespace, cluster-scoped ones must not.
				namespaced, err := env.Client.IsObjectNamespaced(obj)
				if err != nil {
					t.Fatal(err)
				}
				wantNS := ""
				if namespaced {
					wantNS = "default"
				}
				if obj.GetNamespace() != wantNS {
					t.Errorf("namespace %q; want %q for %s", obj.GetNamespace(), wantNS, obj.GetKind())
				}
				if err := create(t, env, ns, obj); err != nil {
					t.Fatalf("sample rejected: %v", err)
				}
			})
		}
	}
	slices.Sort(kinds)
	slices.Sort(wantKinds)
	if !slices.Equal(kinds, wantKinds) {
		t.Fatalf("samples are of kinds %v, want exactly one per CRD: %v", kinds, wantKinds)
	}
}

func TestInvalidBookSample(t *testing.T) {
	env := testenv.Get(t)
	data, err := os.ReadFile(filepath.Join("..", "..", "test", "testdata", "invalid", "book-no-author.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	err = create(t, env, env.Namespace(t), decode(t, string(data)))
	wantInvalid(t, err, "spec.author", "Required value")
	// Besides spec.author the server only notes that it skipped CEL rules on an invalid object.
	var fields []string
	for _, c := range causes(err) {
		if !strings.Contains(c.Message, "validation rules were not checked") {
			fields = append(fields, c.Field+": "+string(c.Type))
		}
	}
	if want := []string{"spec.author: " + string(metav1.CauseTypeFieldValueRequired)}; !slices.Equal(fields, want) {
		t.Fatalf("causes %v, want %v (error %v)", fields, want, err)
	}
}

// Each case creates one object: kind is "<group prefix>/<Kind>", spec is YAML ("" = no spec).
// field is the path the API server must name in an Invalid error, with msg in that cause's
// message; field "" means the object must be accepted.
func TestCreateValidation(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	long := func(n int) string { return strings.Repeat("a", n) }
	for _, tc := range []struct {
		name, kind, spec, field, msg string
	}{
		{"book ok", "library/Book", `{title: T, author: A}`, "", ""},
		{"book no spec", "library/Book", ``, "spec", "Required value"},
		{"book no title", "library/Book", `{author: A}`, "spec.title", "Required value"},
		{"book no author", "library/Book", `{title: T}`, "spec.author", "Required value"},
		{"book empty title", "library/Book", `{title: "", author: A}`, "spec.title", "at least 1"},
		{"book empty author", "library/Book", `{title: T, author: ""}`, "spec.author", "at least 1"},
		{"book long title", "library/Book", `{title: ` + long(513) + `, author: A}`, "spec.title", "Too long"},
		{"book title at max", "library/Book", `{title: ` + long(512) + `, author: A}`, "", ""},
		{"book isbn-10", "library/Book", `{title: T, author: A, isbn: 0-306-40615-2}`, "", ""},
		{"book isbn-10 X", "library/Book", `{title: T, author: A, isbn: 080442957X}`, "", ""},
		{"book isbn-13", "library/Book", `{title: T, author: A, isbn: "9780306406157"}`, "", ""},
		{"book isbn-13 979", "library/Book", `{title: T, author: A, isbn: 979-10-90636-07-1}`, "", ""},
		{"book isbn short", "library/Book", `{title: T, author: A, isbn: "12345"}`, "spec.isbn", "isbn must be an ISBN-10 or ISBN-13"},
		{"book isbn double hyphen", "library/Book", `{title: T, author: A, isbn: 0--306-40615-2}`, "spec.isbn", "isbn must be"},
		{"book isbn-13 X", "library/Book", `{title: T, author: A, isbn: 978030640615X}`, "spec.isbn", "isbn must be"},
		{"book isbn too long", "library/Book", `{title: T, author: A, isbn: 978-0-306-40615-7-1}`, "spec.isbn", "Too long"},
		{"book ttl zero", "library/Book", `{title: T, author: A, ttlSecondsAfterFinished: 0}`, "", ""},
		{"book ttl negative", "library/Book", `{title: T, author: A, ttlSecondsAfterFinished: -1}`, "spec.ttlSecondsAfterFinished", "greater than or equal to 0"},

		{"spc ok", "storage/StoragePoolClaim", `{capacity: 10Gi, minPools: 2, maxPools: 3}`, "", ""},
		{"spc capacity as integer", "storage/StoragePoolClaim", `{capacity: 1073741824}`, "", ""},
		{"spc no spec", "storage/StoragePoolClaim", ``, "spec", "Required value"},
		{"spc no capacity", "storage/StoragePoolClaim", `{}`, "spec.capacity", "Required value"},
		{"spc capacity not a quantity", "storage/StoragePoolClaim", `{capacity: lots}`, "spec.capacity", "should match"},
		{"spc zero capacity", "storage/StoragePoolClaim", `{capacity: "0"}`, "spec.capacity", "capacity must be greater than zero"},
		{"spc zero capacity integer", "storage/StoragePoolClaim", `{capacity: 0}`, "spec.capacity", "capacity must be greater than zero"},
		{"spc negative capacity", "storage/StoragePoolClaim", `{capacity: -1Gi}`, "spec.capacity", "capacity must be greater than zero"},
		{"spc 8Ei", "storage/StoragePoolClaim", `{capacity: 8Ei}`, "spec.capacity", "capacity must be less than 8Ei"},
		{"spc just under 8Ei", "storage/StoragePoolClaim", `{capacity: 8191Pi}`, "", ""},
		{"spc min > max", "storage/StoragePoolClaim", `{capacity: 1Gi, minPools: 3, maxPools: 2}`, "spec.minPools", "minPools must be less than or equal to maxPools"},
		{"spc min = max", "storage/StoragePoolClaim", `{capacity: 1Gi, minPools: 2, maxPools: 2}`, "", ""},
		{"spc default min > max", "storage/StoragePoolClaim", `{capacity: 1Gi, maxPools: 1}`, "", ""},
		{"spc min zero", "storage/StoragePoolClaim", `{capacity: 1Gi, minPools: 0}`, "spec.minPools", "greater than or equal to 1"},
		{"spc max zero", "storage/StoragePoolClaim", `{capacity: 1Gi, maxPools: 0}`, "spec.maxPools", "greater than or equal to 1"},
		{"spc bad poolType", "storage/StoragePoolClaim", `{capacity: 1Gi, poolType: raid5}`, "spec.poolType", "Unsupported value"},
		{"spc bad backend", "storage/StoragePoolClaim", `{capacity: 1Gi, backend: ceph}`, "spec.backend", "Unsupported value"},

		{"csp ok", "storage/CStorPool", `{nodeName: node-a, claim: claim-a, capacity: 1Gi, poolType: raidz2, backend: zfs}`, "", ""},
		{"csp no spec", "storage/CStorPool", ``, "spec", "Required value"},
		{"csp no node", "storage/CStorPool", `{claim: claim-a, capacity: 1Gi}`, "spec.nodeName", "Required value"},
		{"csp no claim", "storage/CStorPool", `{nodeName: node-a, capacity: 1Gi}`, "spec.claim", "Required value"},
		{"csp no capacity", "storage/CStorPool", `{nodeName: node-a, claim: claim-a}`, "spec.capacity", "Required value"},
		{"csp empty node", "storage/CStorPool", `{nodeName: "", claim: claim-a, capacity: 1Gi}`, "spec.nodeName", "at least 1"},
		{"csp empty claim", "storage/CStorPool", `{nodeName: node-a, claim: "", capacity: 1Gi}`, "spec.claim", "at least 1"},
		{"csp long node", "storage/CStorPool", `{nodeName: ` + long(254) + `, claim: claim-a, capacity: 1Gi}`, "spec.nodeName", "Too long"},
		{"csp capacity not a quantity", "storage/CStorPool", `{nodeName: node-a, claim: claim-a, capacity: 1GB}`, "spec.capacity", "should match"},
		{"csp zero capacity", "storage/CStorPool", `{nodeName: node-a, claim: claim-a, capacity: 0Gi}`, "spec.capacity", "capacity must be greater than zero"},
		{"csp 10Ei", "storage/CStorPool", `{nodeName: node-a, claim: claim-a, capacity: 10Ei}`, "spec.capacity", "capacity must be less than 8Ei"},
		{"csp bad poolType", "storage/CStorPool", `{nodeName: node-a, claim: claim-a, capacity: 1Gi, poolType: raid5}`, "spec.poolType", "Unsupported value"},
		{"csp bad backend", "storage/CStorPool", `{nodeName: node-a, claim: claim-a, capacity: 1Gi, backend: ceph}`, "spec.backend", "Unsupported value"},

		{"cv ok", "storage/CStorVolume", `{capacity: 1Gi}`, "", ""},
		{"cv no spec", "storage/CStorVolume", ``, "spec", "Required value"},
		{"cv no capacity", "storage/CStorVolume", `{replicationFactor: 1}`, "spec.capacity", "Required value"},
		{"cv capacity not a quantity", "storage/CStorVolume", `{capacity: 1 Gi}`, "spec.capacity", "should match"},
		{"cv zero capacity", "storage/CStorVolume", `{capacity: "0"}`, "spec.capacity", "capacity must be greater than zero"},
		{"cv 16Ei", "storage/CStorVolume", `{capacity: 16Ei}`, "spec.capacity", "capacity must be less than 8Ei"},
		{"cv 10Ei", "storage/CStorVolume", `{capacity: 10Ei}`, "spec.capacity", "capacity must be less than 8Ei"},
		{"cv 2^64 bytes", "storage/CStorVolume", `{capacity: "18446744073709551616"}`, "spec.capacity", "capacity must be less than 8Ei"},
		{"cv 7Ei", "storage/CStorVolume", `{capacity: 7Ei}`, "", ""},
		{"cv cf with default rf", "storage/CStorVolume", `{capacity: 1Gi, consistencyFactor: 3}`, "", ""},
		{"cv cf > default rf", "storage/CStorVolume", `{capacity: 1Gi, consistencyFactor: 4}`, "spec.consistencyFactor", "consistencyFactor must be less than or equal to replicationFactor"},
		{"cv cf > rf", "storage/CStorVolume", `{capacity: 1Gi, replicationFactor: 1, consistencyFactor: 2}`, "spec.consistencyFactor", "consistencyFactor must be"},
		{"cv cf zero", "storage/CStorVolume", `{capacity: 1Gi, consistencyFactor: 0}`, "spec.consistencyFactor", "greater than or equal to 1"},
		{"cv rf zero", "storage/CStorVolume", `{capacity: 1Gi, replicationFactor: 0}`, "spec.replicationFactor", "greater than or equal to 1"},
		{"cv rf max", "storage/CStorVolume", `{capacity: 1Gi, replicationFactor: 5}`, "", ""},
		{"cv rf too big", "storage/CStorVolume", `{capacity: 1Gi, replicationFactor: 6}`, "spec.replicationFactor", "less than or equal to 5"},
		{"cv ttl negative", "storage/CStorVolume", `{capacity: 1Gi, ttlSecondsAfterFinished: -1}`, "spec.ttlSecondsAfterFinished", "greater than or equal to 0"},

		{"cvr ok", "storage/CStorVolumeReplica", `{volume: vol-a, pool: pool-a, nodeName: node-a, capacity: 1Gi}`, "", ""},
		{"cvr no spec", "storage/CStorVolumeReplica", ``, "spec", "Required value"},
		{"cvr no volume", "storage/CStorVolumeReplica", `{pool: pool-a, nodeName: node-a, capacity: 1Gi}`, "spec.volume", "Required value"},
		{"cvr no pool", "storage/CStorVolumeReplica", `{volume: vol-a, nodeName: node-a, capacity: 1Gi}`, "spec.pool", "Required value"},
		{"cvr no node", "storage/CStorVolumeReplica", `{volume: vol-a, pool: pool-a, capacity: 1Gi}`, "spec.nodeName", "Required value"},
		{"cvr no capacity", "storage/CStorVolumeReplica", `{volume: vol-a, pool: pool-a, nodeName: node-a}`, "spec.capacity", "Required value"},
		{"cvr empty volume", "storage/CStorVolumeReplica", `{volume: "", pool: pool-a, nodeName: node-a, capacity: 1Gi}`, "spec.volume", "at least 1"},
		{"cvr empty pool", "storage/CStorVolumeReplica", `{volume: vol-a, pool: "", nodeName: node-a, capacity: 1Gi}`, "spec.pool", "at least 1"},
		{"cvr zero capacity", "storage/CStorVolumeReplica", `{volume: vol-a, pool: pool-a, nodeName: node-a, capacity: 0Mi}`, "spec.capacity", "capacity must be greater than zero"},
		{"cvr 8Ei", "storage/CStorVolumeReplica", `{volume: vol-a, pool: pool-a, nodeName: node-a, capacity: 8Ei}`, "spec.capacity", "capacity must be less than 8Ei"},

		{"pr ok", "scm/PullRequest", `{user: u, branch: b, status: open, id: 1, repository: o/r, number: 1, updatedAt: "2019-09-19T23:23:12Z"}`, "", ""},
		{"pr no spec", "scm/PullRequest", ``, "spec", "Required value"},
		{"pr no user", "scm/PullRequest", `{branch: b, status: open, id: 1, repository: o/r, number: 1}`, "spec.user", "Required value"},
		{"pr no branch", "scm/PullRequest", `{user: u, status: open, id: 1, repository: o/r, number: 1}`, "spec.branch", "Required value"},
		{"pr no status", "scm/PullRequest", `{user: u, branch: b, id: 1, repository: o/r, number: 1}`, "spec.status", "Required value"},
		{"pr no id", "scm/PullRequest", `{user: u, branch: b, status: open, repository: o/r, number: 1}`, "spec.id", "Required value"},
		{"pr no repository", "scm/PullRequest", `{user: u, branch: b, status: open, id: 1, number: 1}`, "spec.repository", "Required value"},
		{"pr no number", "scm/PullRequest", `{user: u, branch: b, status: open, id: 1, repository: o/r}`, "spec.number", "Required value"},
		{"pr empty user", "scm/PullRequest", `{user: "", branch: b, status: open, id: 1, repository: o/r, number: 1}`, "spec.user", "at least 1"},
		{"pr long user", "scm/PullRequest", `{user: ` + long(101) + `, branch: b, status: open, id: 1, repository: o/r, number: 1}`, "spec.user", "Too long"},
		{"pr bad status", "scm/PullRequest", `{user: u, branch: b, status: merged, id: 1, repository: o/r, number: 1}`, "spec.status", "Unsupported value"},
		{"pr bad repository", "scm/PullRequest", `{user: u, branch: b, status: open, id: 1, repository: r, number: 1}`, "spec.repository", "repository must be owner/name"},
		{"pr id zero", "scm/PullRequest", `{user: u, branch: b, status: open, id: 0, repository: o/r, number: 1}`, "spec.id", "greater than or equal to 1"},
		{"pr number zero", "scm/PullRequest", `{user: u, branch: b, status: open, id: 1, repository: o/r, number: 0}`, "spec.number", "greater than or equal to 1"},
		{"pr bad sha", "scm/PullRequest", `{user: u, branch: b, status: open, id: 1, repository: o/r, number: 1, headSha: ABC}`, "spec.headSha", "headSha must be"},
		{"pr bad updatedAt", "scm/PullRequest", `{user: u, branch: b, status: open, id: 1, repository: o/r, number: 1, updatedAt: yesterday}`, "spec.updatedAt", "date-time"},
		{"pr long lastAction", "scm/PullRequest", `{user: u, branch: b, status: open, id: 1, repository: o/r, number: 1, lastAction: ` + long(65) + `}`, "spec.lastAction", "Too long"},

		{"branch ok", "scm/Branch", `{name: main, state: pushed, repository: o/r, headSha: "0000000000000000000000000000000000000000"}`, "", ""},
		{"branch no spec", "scm/Branch", ``, "spec", "Required value"},
		{"branch no name", "scm/Branch", `{state: pushed, repository: o/r}`, "spec.name", "Required value"},
		{"branch no state", "scm/Branch", `{name: main, repository: o/r}`, "spec.state", "Required value"},
		{"branch no repository", "scm/Branch", `{name: main, state: pushed}`, "spec.repository", "Required value"},
		{"branch empty name", "scm/Branch", `{name: "", state: pushed, repository: o/r}`, "spec.name", "at least 1"},
		{"branch bad state", "scm/Branch", `{name: main, state: merged, repository: o/r}`, "spec.state", "Unsupported value"},
		{"branch bad repository", "scm/Branch", `{name: main, state: pushed, repository: o/r/x}`, "spec.repository", "repository must be owner/name"},
		{"branch bad sha", "scm/Branch", `{name: main, state: pushed, repository: o/r, headSha: abc}`, "spec.headSha", "headSha must be"},
		{"branch bad updatedAt", "scm/Branch", `{name: main, state: pushed, repository: o/r, updatedAt: "2019-09-19"}`, "spec.updatedAt", "date-time"},

		{"btc ok", "bitcoin/BitcoinNetwork", `{nodes: 3, network: testnet, secretName: rpc}`, "", ""},
		{"btc no spec", "bitcoin/BitcoinNetwork", ``, "", ""},
		{"btc zero nodes", "bitcoin/BitcoinNetwork", `{nodes: 0}`, "spec.nodes", "greater than or equal to 1"},
		{"btc too many nodes", "bitcoin/BitcoinNetwork", `{nodes: 11}`, "spec.nodes", "less than or equal to 10"},
		{"btc bad network", "bitcoin/BitcoinNetwork", `{network: signet}`, "spec.network", "Unsupported value"},
		{"btc bad implementation", "bitcoin/BitcoinNetwork", `{implementation: bitcoin-qt}`, "spec.implementation", `supported values: "bitcoind", "btcd"`},
		{"btc storage 8Ei", "bitcoin/BitcoinNetwork", `{storage: {size: 8Ei}}`, "spec.storage.size", "size must be less than 8Ei"},
		{"btc empty image", "bitcoin/BitcoinNetwork", `{image: ""}`, "spec.image", "at least 1"},
		{"btc empty secretName", "bitcoin/BitcoinNetwork", `{secretName: ""}`, "spec.secretName", "at least 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := create(t, env, ns, object(t, tc.name, tc.kind, tc.spec))
			if tc.field == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			wantInvalid(t, err, tc.field, tc.msg)
		})
	}
}

// Each case creates a valid object, then writes status through the status subresource.
func TestStatusValidation(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	const (
		csp  = `{nodeName: node-a, claim: claim-a, capacity: 1Gi}`
		cv   = `{capacity: 1Gi}`
		cvr  = `{volume: vol-a, pool: pool-a, nodeName: node-a, capacity: 1Gi}`
		cond = `{type: Ready, status: "True", reason: Succeeded, message: "", lastTransitionTime: "2024-01-01T00:00:00Z"}`
	)
	for _, tc := range []struct {
		name, kind, spec, status, field, msg string
	}{
		{"book ok", "library/Book", `{title: T, author: A}`, `{observedGeneration: 1, conditions: [` + cond + `]}`, "", ""},
		{"book condition status", "library/Book", `{title: T, author: A}`, `{conditions: [{type: Ready, status: Maybe, reason: R, message: "", lastTransitionTime: "2024-01-01T00:00:00Z"}]}`, "status.conditions[0].status", "Unsupported value"},
		{"book condition no reason", "library/Book", `{title: T, author: A}`, `{conditions: [{type: Ready, status: "True", message: "", lastTransitionTime: "2024-01-01T00:00:00Z"}]}`, "status.conditions[0].reason", "Required value"},

		{"spc ok", "storage/StoragePoolClaim", `{capacity: 1Gi}`, `{desiredPools: 2, provisionedPools: 2, healthyPools: 1}`, "", ""},

		{"csp ok", "storage/CStorPool", csp, `{phase: Healthy, capacity: {total: 1Gi, free: 512Mi, used: 512Mi}, conditions: [` + cond + `]}`, "", ""},
		{"csp bad phase", "storage/CStorPool", csp, `{phase: Ready}`, "status.phase", "Unsupported value"},
		{"csp bad capacity", "storage/CStorPool", csp, `{capacity: {total: lots}}`, "status.capacity.total", "should match"},

		{"cv ok", "storage/CStorVolume", cv, `{phase: Degraded, replicas: [{name: r, pool: pool-a, node: node-a, phase: Healthy}], readyReplicas: 1, desiredReplicas: 3}`, "", ""},
		{"cv bad phase", "storage/CStorVolume", cv, `{phase: Ready}`, "status.phase", "Unsupported value"},
		{"cv replica bad phase", "storage/CStorVolume", cv, `{replicas: [{name: r, pool: pool-a, node: node-a, phase: Degraded}]}`, "status.replicas[0].phase", "Unsupported value"},
		{"cv replica no name", "storage/CStorVolume", cv, `{replicas: [{pool: pool-a, node: node-a}]}`, "status.replicas[0].name", "Required value"},
		{"cv replica no pool", "storage/CStorVolume", cv, `{replicas: [{name: r, node: node-a}]}`, "status.replicas[0].pool", "Required value"},
		{"cv replica no node", "storage/CStorVolume", cv, `{replicas: [{name: r, pool: pool-a}]}`, "status.replicas[0].node", "Required value"},
		{"cv duplicate replica", "storage/CStorVolume", cv, `{replicas: [{name: r, pool: pool-a, node: node-a}, {name: r, pool: pool-b, node: node-b}]}`, "status.replicas[1]", "Duplicate value"},

		{"cvr ok", "storage/CStorVolumeReplica", cvr, `{phase: Healthy, capacity: {total: 1Gi, used: "0"}}`, "", ""},
		{"cvr bad phase", "storage/CStorVolumeReplica", cvr, `{phase: Degraded}`, "status.phase", "Unsupported value"},
		{"cvr bad capacity", "storage/CStorVolumeReplica", cvr, `{capacity: {used: 1 Gi}}`, "status.capacity.used", "should match"},

		{"pr ok", "scm/PullRequest", `{user: u, branch: b, status: open, id: 1, repository: o/r, number: 1}`, `{observedGeneration: 1}`, "", ""},
		{"branch ok", "scm/Branch", `{name: main, state: pushed, repository: o/r}`, `{observedGeneration: 1}`, "", ""},

		{"btc ok", "bitcoin/BitcoinNetwork", `{}`, `{readyNodes: 1, peers: 0, nodes: [{name: n-0, ip: 10.0.0.1, ready: true}, {name: n-1}]}`, "", ""},
		{"btc node no name", "bitcoin/BitcoinNetwork", `{}`, `{nodes: [{ip: 10.0.0.1}]}`, "status.nodes[0].name", "Required value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := object(t, tc.name, tc.kind, tc.spec)
			if err := create(t, env, ns, obj); err != nil {
				t.Fatalf("create: %v", err)
			}
			obj.Object["status"] = value(t, tc.status)
			err := env.Client.Status().Update(t.Context(), obj)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("status rejected: %v", err)
				}
				return
			}
			wantInvalid(t, err, tc.field, tc.msg)
		})
	}
}

// Each case creates an object with spec old, then updates it to spec new.
func TestImmutability(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	const (
		csp = `{nodeName: node-a, claim: claim-a, capacity: 1Gi, poolType: striped, backend: file}`
		cvr = `{volume: vol-a, pool: pool-a, nodeName: node-a, capacity: 1Gi}`
		pr  = `{user: u, branch: b, status: open, id: 1, repository: o/r, number: 1}`
		br  = `{name: main, state: pushed, repository: o/r}`
	)
	for _, tc := range []struct {
		name, kind, old, new, field, msg string
	}{
		{"spc poolType", "storage/StoragePoolClaim", `{capacity: 1Gi}`, `{capacity: 1Gi, poolType: mirrored}`, "spec.poolType", "poolType is immutable"},
		{"spc backend", "storage/StoragePoolClaim", `{capacity: 1Gi, backend: file}`, `{capacity: 1Gi, backend: zfs}`, "spec.backend", "backend is immutable"},
		{"spc scale", "storage/StoragePoolClaim", `{capacity: 1Gi, maxPools: 2}`, `{capacity: 2Gi, minPools: 2, maxPools: 4}`, "", ""},
		{"csp node", "storage/CStorPool", csp, `{nodeName: node-b, claim: claim-a, capacity: 1Gi}`, "spec.nodeName", "nodeName is immutable"},
		{"csp claim", "storage/CStorPool", csp, `{nodeName: node-a, claim: claim-b, capacity: 1Gi}`, "spec.claim", "claim is immutable"},
		{"csp poolType", "storage/CStorPool", csp, `{nodeName: node-a, claim: claim-a, capacity: 1Gi, poolType: mirrored}`, "spec.poolType", "poolType is immutable"},
		{"csp backend", "storage/CStorPool", csp, `{nodeName: node-a, claim: claim-a, capacity: 1Gi, backend: zfs}`, "spec.backend", "backend is immutable"},
		{"csp capacity", "storage/CStorPool", csp, `{nodeName: node-a, claim: claim-a, capacity: 2Gi}`, "", ""},
		{"cv capacity grows", "storage/CStorVolume", `{capacity: 1Gi}`, `{capacity: 2Gi}`, "", ""},
		{"cv capacity shrinks", "storage/CStorVolume", `{capacity: 2Gi}`, `{capacity: 1Gi}`, "spec.capacity", "capacity may grow but not shrink"},
		{"cv capacity same, other unit", "storage/CStorVolume", `{capacity: 1Gi}`, `{capacity: 1073741824}`, "", ""},
		{"cv source", "storage/CStorVolume", `{capacity: 1Gi, source: {snapshot: a}}`, `{capacity: 1Gi, source: {snapshot: b}}`, "spec.source", "source is immutable"},
		{"cvsnap volume", "storage/CStorVolumeSnapshot", `{volume: a}`, `{volume: b}`, "spec.volume", "volume is immutable"},
		{"cv rf", "storage/CStorVolume", `{capacity: 1Gi}`, `{capacity: 1Gi, replicationFactor: 5}`, "spec.replicationFactor", "replicationFactor is immutable"},
		{"cv rf explicit default", "storage/CStorVolume", `{capacity: 1Gi}`, `{capacity: 1Gi, replicationFactor: 3}`, "", ""},
		{"cv cf", "storage/CStorVolume", `{capacity: 1Gi}`, `{capacity: 1Gi, consistencyFactor: 2}`, "", ""},
		{"cvr volume", "storage/CStorVolumeReplica", cvr, `{volume: vol-b, pool: pool-a, nodeName: node-a, capacity: 1Gi}`, "spec.volume", "volume is immutable"},
		{"cvr pool", "storage/CStorVolumeReplica", cvr, `{volume: vol-a, pool: pool-b, nodeName: node-a, capacity: 1Gi}`, "spec.pool", "pool is immutable"},
		{"cvr node", "storage/CStorVolumeReplica", cvr, `{volume: vol-a, pool: pool-a, nodeName: node-b, capacity: 1Gi}`, "spec.nodeName", "nodeName is immutable"},
		{"cvr capacity grows", "storage/CStorVolumeReplica", cvr, `{volume: vol-a, pool: pool-a, nodeName: node-a, capacity: 2Gi}`, "", ""},
		{"cvr capacity shrinks", "storage/CStorVolumeReplica", cvr, `{volume: vol-a, pool: pool-a, nodeName: node-a, capacity: 512Mi}`, "spec.capacity", "capacity may grow but not shrink"},
		{"pr id", "scm/PullRequest", pr, `{user: u, branch: b, status: open, id: 2, repository: o/r, number: 1}`, "spec.id", "id is immutable"},
		{"pr repository", "scm/PullRequest", pr, `{user: u, branch: b, status: open, id: 1, repository: o/s, number: 1}`, "spec.repository", "repository is immutable"},
		{"pr number", "scm/PullRequest", pr, `{user: u, branch: b, status: open, id: 1, repository: o/r, number: 2}`, "spec.number", "number is immutable"},
		{"pr close", "scm/PullRequest", pr, `{user: v, branch: c, status: closed, merged: true, id: 1, repository: o/r, number: 1, lastAction: closed}`, "", ""},
		{"branch name", "scm/Branch", br, `{name: dev, state: pushed, repository: o/r}`, "spec.name", "name is immutable"},
		{"branch repository", "scm/Branch", br, `{name: main, state: pushed, repository: o/s}`, "spec.repository", "repository is immutable"},
		{"branch delete", "scm/Branch", br, `{name: main, state: deleted, repository: o/r}`, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := object(t, tc.name, tc.kind, tc.old)
			if err := create(t, env, ns, obj); err != nil {
				t.Fatalf("create: %v", err)
			}
			obj.Object["spec"] = value(t, tc.new)
			err := env.Client.Update(t.Context(), obj)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("update rejected: %v", err)
				}
				return
			}
			wantInvalid(t, err, tc.field, tc.msg)
		})
	}

	// Immutability rules constrain spec only: the agent's status write is accepted and leaves
	// spec and generation alone.
	t.Run("status-only update", func(t *testing.T) {
		obj := object(t, "status-only", "storage/CStorVolumeReplica", cvr)
		if err := create(t, env, ns, obj); err != nil {
			t.Fatalf("create: %v", err)
		}
		spec := obj.Object["spec"]
		obj.Object["status"] = map[string]any{"observedGeneration": int64(1), "phase": "Healthy",
			"capacity": map[string]any{"total": "1Gi", "used": "4Ki"}}
		if err := env.Client.Status().Update(t.Context(), obj); err != nil {
			t.Fatalf("status update rejected: %v", err)
		}
		got := get(t, env, obj)
		if phase, _, _ := unstructured.NestedString(got.Object, "status", "phase"); phase != "Healthy" {
			t.Errorf("status.phase = %q after status update, want Healthy", phase)
		}
		if !reflect.DeepEqual(got.Object["spec"], spec) || got.GetGeneration() != 1 {
			t.Errorf("after status update: spec %v, generation %d; want spec %v unchanged, generation 1", got.Object["spec"], got.GetGeneration(), spec)
		}
	})
}

// Fields left out are defaulted by the API server to the values the Go code assumes.
func TestDefaults(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	for _, tc := range []struct {
		name, kind, spec string
		want             map[string]any // spec field -> value read back
	}{
		{"spc", "storage/StoragePoolClaim", `{capacity: 1Gi}`, map[string]any{
			"poolType": string(storagev1alpha1.PoolTypeStriped), "backend": string(storagev1alpha1.BackendFile), "minPools": int64(1)}},
		{"csp", "storage/CStorPool", `{nodeName: node-a, claim: claim-a, capacity: 1Gi}`, map[string]any{
			"poolType": string(storagev1alpha1.PoolTypeStriped), "backend": string(storagev1alpha1.BackendFile)}},
		{"cv", "storage/CStorVolume", `{capacity: 1Gi}`, map[string]any{
			"replicationFactor": int64(storagev1alpha1.DefaultReplicationFactor)}},
		// No image: a CRD default cannot depend on the implementation, the operator picks it
		// (BitcoinNetworkSpec.ImageOrDefault).
		{"btc no spec", "bitcoin/BitcoinNetwork", ``, map[string]any{
			"nodes": int64(2), "network": string(bitcoinv1alpha1.NetworkRegtest), "implementation": string(bitcoinv1alpha1.ImplementationBitcoind), "image": nil}},
		{"btc empty spec", "bitcoin/BitcoinNetwork", `{}`, map[string]any{
			"nodes": int64(2), "network": string(bitcoinv1alpha1.NetworkRegtest), "implementation": string(bitcoinv1alpha1.ImplementationBitcoind), "image": nil}},
		{"btc explicit", "bitcoin/BitcoinNetwork", `{nodes: 5, network: mainnet, implementation: btcd}`, map[string]any{
			"nodes": int64(5), "network": string(bitcoinv1alpha1.NetworkMainnet), "implementation": string(bitcoinv1alpha1.ImplementationBtcd), "image": nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := object(t, tc.name, tc.kind, tc.spec)
			if err := create(t, env, ns, obj); err != nil {
				t.Fatalf("create: %v", err)
			}
			spec, _, _ := unstructured.NestedMap(get(t, env, obj).Object, "spec")
			for k, want := range tc.want {
				if spec[k] != want {
					t.Errorf("spec.%s = %#v, want %#v (spec %v)", k, spec[k], want, spec)
				}
			}
		})
	}
}

// decode parses a YAML document the way the API server sees it (integers as int64).
func decode(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	data, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		t.Fatalf("parse %q: %v", doc, err)
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(data); err != nil {
		t.Fatalf("parse %q: %v", doc, err)
	}
	return obj
}

// value parses a YAML value as the API server sees it (integers as int64).
func value(t *testing.T, doc string) any {
	t.Helper()
	data, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		t.Fatalf("parse %q: %v", doc, err)
	}
	var v any
	if err := utiljson.Unmarshal(data, &v); err != nil {
		t.Fatalf("parse %q: %v", doc, err)
	}
	return v
}

// object builds a custom resource of kind "<group prefix>/<Kind>" named after the test case,
// with the given spec ("" for none).
func object(t *testing.T, name, kind, spec string) *unstructured.Unstructured {
	t.Helper()
	group, k, _ := strings.Cut(kind, "/")
	doc := "{apiVersion: " + group + ".crdipc.io/v1alpha1, kind: " + k
	if spec != "" {
		doc += ", spec: " + spec
	}
	obj := decode(t, doc+"}")
	obj.SetGenerateName(strings.Trim(nonDNS.ReplaceAllString(strings.ToLower(name), "-"), "-") + "-")
	return obj
}

var nonDNS = regexp.MustCompile(`[^a-z0-9]+`)

// create creates obj: namespaced kinds in ns (whatever namespace obj names); cluster-scoped ones
// under a unique name (the given name plus a random suffix), deleted when the test ends.
func create(t *testing.T, env *testenv.Env, ns string, obj *unstructured.Unstructured) error {
	t.Helper()
	namespaced, err := env.Client.IsObjectNamespaced(obj)
	if err != nil {
		t.Fatalf("scope of %s: %v", obj.GroupVersionKind(), err)
	}
	if namespaced {
		obj.SetNamespace(ns)
	} else {
		obj.SetNamespace("")
		if obj.GetName() != "" {
			obj.SetGenerateName(obj.GetName() + "-")
			obj.SetName("")
		}
	}
	if err := env.Client.Create(t.Context(), obj); err != nil {
		return err
	}
	if !namespaced {
		del := obj.DeepCopy()
		t.Cleanup(func() {
			if err := env.Client.Delete(context.Background(), del); client.IgnoreNotFound(err) != nil {
				t.Errorf("deleting %s %s: %v", del.GetKind(), del.GetName(), err)
			}
		})
	}
	return nil
}

// get reads obj back from the API server.
func get(t *testing.T, env *testenv.Env, obj *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(obj.GroupVersionKind())
	if err := env.Client.Get(t.Context(), client.ObjectKeyFromObject(obj), got); err != nil {
		t.Fatalf("get %s %s: %v", obj.GetKind(), obj.GetName(), err)
	}
	return got
}

// wantInvalid fails unless err is the API server's Invalid (422) error naming field, with a
// cause for exactly that field whose message contains msg.
func wantInvalid(t *testing.T, err error, field, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted; want Invalid naming %s", field)
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("got %v (reason %q); want Invalid (422) naming %s", err, apierrors.ReasonForError(err), field)
	}
	if !strings.Contains(err.Error(), field) {
		t.Fatalf("error %q does not name %s", err, field)
	}
	for _, c := range causes(err) {
		if c.Field == field && strings.Contains(c.Message, msg) {
			return
		}
	}
	t.Fatalf("error %q has no cause for %s containing %q", err, field, msg)
}

func causes(err error) []metav1.StatusCause {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return nil
	}
	return status.Status().Details.Causes
}
