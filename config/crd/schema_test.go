package crd_test

// These tests run the API server's own CRD code (CRD validation incl. CEL compilation and cost
// estimation, defaulting, OpenAPI and CEL validation of objects) in-process, so a bad marker or
// CEL rule fails in `go test` without starting an API server.

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsinstall "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/install"
	apiextensionsvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	bitcoinv1alpha1 "github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/config/crd"
)

type kindValidator struct {
	structural *structuralschema.Structural
	schema     apiservervalidation.SchemaValidator
	cel        *cel.Validator
	namespaced bool
}

// loadValidators validates every embedded CRD as the API server would on create and returns
// an object validator per kind.
func loadValidators(t *testing.T) map[schema.GroupKind]*kindValidator {
	t.Helper()
	scheme := runtime.NewScheme()
	apiextensionsinstall.Install(scheme)

	crds, err := crd.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	out := map[schema.GroupKind]*kindValidator{}
	for _, v1crd := range crds {
		scheme.Default(v1crd)
		internal := &apiextensions.CustomResourceDefinition{}
		if err := scheme.Convert(v1crd, internal, nil); err != nil {
			t.Fatalf("%s: convert: %v", v1crd.Name, err)
		}
		// The API server sets this on create; validation requires it.
		internal.Status.StoredVersions = []string{internal.Spec.Versions[0].Name}
		if errs := apiextensionsvalidation.ValidateCustomResourceDefinition(context.Background(), internal); len(errs) > 0 {
			t.Errorf("%s: the API server would reject this CRD:\n%v", v1crd.Name, errs.ToAggregate())
			continue
		}
		// The internal type hoists a schema shared by all versions to spec.validation.
		props := internal.Spec.Validation.OpenAPIV3Schema
		s, err := structuralschema.NewStructural(props)
		if err != nil {
			t.Fatalf("%s: structural schema: %v", v1crd.Name, err)
		}
		sv, _, err := apiservervalidation.NewSchemaValidator(props)
		if err != nil {
			t.Fatalf("%s: schema validator: %v", v1crd.Name, err)
		}
		gk := schema.GroupKind{Group: internal.Spec.Group, Kind: internal.Spec.Names.Kind}
		out[gk] = &kindValidator{structural: s, schema: sv, cel: cel.NewValidator(s, true, celconfig.PerCallLimit),
			namespaced: internal.Spec.Scope == apiextensions.NamespaceScoped}
	}
	return out
}

// admit defaults obj and validates it (against old, when updating) the way the API server does
// for a custom resource, returning the field errors.
func admit(t *testing.T, vs map[schema.GroupKind]*kindValidator, obj, old map[string]any) field.ErrorList {
	t.Helper()
	v := validatorFor(t, vs, obj)
	structuraldefaulting.Default(obj, v.structural)
	var errs field.ErrorList
	if old == nil {
		errs = apiservervalidation.ValidateCustomResource(nil, obj, v.schema)
	} else {
		structuraldefaulting.Default(old, v.structural)
		errs = apiservervalidation.ValidateCustomResourceUpdate(nil, obj, old, v.schema)
	}
	var oldObj any
	if old != nil {
		oldObj = old
	}
	celErrs, _ := v.cel.Validate(context.Background(), nil, v.structural, obj, oldObj, celconfig.RuntimeCELCostBudget)
	return append(errs, celErrs...)
}

func validatorFor(t *testing.T, vs map[schema.GroupKind]*kindValidator, obj map[string]any) *kindValidator {
	t.Helper()
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		t.Fatalf("apiVersion %q: %v", apiVersion, err)
	}
	v, ok := vs[gv.WithKind(kind).GroupKind()]
	if !ok {
		t.Fatalf("no CRD for %s %s", apiVersion, kind)
	}
	return v
}

func parse(t *testing.T, doc string) map[string]any {
	t.Helper()
	// Through JSON with apimachinery's decoder, so integers are int64 as in the API server.
	data, err := yaml.YAMLToJSON([]byte(doc))
	if err != nil {
		t.Fatalf("parse %q: %v", doc, err)
	}
	obj := map[string]any{}
	if err := utiljson.Unmarshal(data, &obj); err != nil {
		t.Fatalf("parse %q: %v", doc, err)
	}
	return obj
}

func TestCRDsPassAPIServerValidation(t *testing.T) {
	if vs := loadValidators(t); len(vs) != 8 {
		t.Fatalf("got validators for %d kinds, want 8", len(vs))
	}
}

func TestSamples(t *testing.T) {
	vs := loadValidators(t)
	root := filepath.Join("..", "samples")
	var n int
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n++
		obj := parse(t, string(data))
		errs := admit(t, vs, obj, nil)
		rel, _ := filepath.Rel(root, path)
		invalid := strings.HasPrefix(rel, "invalid"+string(filepath.Separator))
		switch {
		case invalid && len(errs) == 0:
			t.Errorf("%s: invalid sample was accepted", rel)
		case !invalid && len(errs) > 0:
			t.Errorf("%s: sample rejected: %v", rel, errs.ToAggregate())
		}
		// `kubectl apply -R -f config/samples` must work without -n: namespaced samples
		// name their namespace, cluster-scoped ones must not.
		md, _ := obj["metadata"].(map[string]any)
		ns, _ := md["namespace"].(string)
		if v := validatorFor(t, vs, obj); v.namespaced != (ns == "default") {
			t.Errorf("%s: namespace %q; want \"default\" for namespaced kinds and none otherwise", rel, ns)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 9 {
		t.Fatalf("found %d samples under %s, want at least 9 (one per kind plus the invalid one)", n, root)
	}
}

func TestInvalidBookNamesAuthor(t *testing.T) {
	vs := loadValidators(t)
	data, err := os.ReadFile(filepath.Join("..", "..", "test", "testdata", "invalid", "book-no-author.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	errs := admit(t, vs, parse(t, string(data)), nil)
	if len(errs) != 1 || errs[0].Field != "spec.author" || errs[0].Type != field.ErrorTypeRequired {
		t.Fatalf("want exactly spec.author: Required value, got %v", errs.ToAggregate())
	}
}

// Each case is a spec for one kind; wantErr is a substring of the expected error ("" = valid).
func TestValidation(t *testing.T) {
	vs := loadValidators(t)
	for _, tc := range []struct {
		name, kind, spec, wantErr string
	}{
		{"book ok", "library/Book", `{title: T, author: A}`, ""},
		{"book empty title", "library/Book", `{title: "", author: A}`, "spec.title"},
		{"book isbn-10", "library/Book", `{title: T, author: A, isbn: 0-306-40615-2}`, ""},
		{"book isbn-10 X", "library/Book", `{title: T, author: A, isbn: 080442957X}`, ""},
		{"book isbn-13", "library/Book", `{title: T, author: A, isbn: "9780306406157"}`, ""},
		{"book isbn-13 979", "library/Book", `{title: T, author: A, isbn: 979-10-90636-07-1}`, ""},
		{"book isbn short", "library/Book", `{title: T, author: A, isbn: "12345"}`, "isbn must be an ISBN-10 or ISBN-13"},
		{"book isbn double hyphen", "library/Book", `{title: T, author: A, isbn: 0--306-40615-2}`, "isbn must be"},
		{"book isbn-13 X", "library/Book", `{title: T, author: A, isbn: 978030640615X}`, "isbn must be"},
		{"book ttl negative", "library/Book", `{title: T, author: A, ttlSecondsAfterFinished: -1}`, "ttlSecondsAfterFinished"},

		{"spc ok", "storage/StoragePoolClaim", `{capacity: 10Gi, minPools: 2, maxPools: 3}`, ""},
		{"spc capacity as integer", "storage/StoragePoolClaim", `{capacity: 1073741824}`, ""},
		{"spc no capacity", "storage/StoragePoolClaim", `{}`, "spec.capacity"},
		{"spc zero capacity", "storage/StoragePoolClaim", `{capacity: "0"}`, "capacity must be greater than zero"},
		{"spc zero capacity integer", "storage/StoragePoolClaim", `{capacity: 0}`, "capacity must be greater than zero"},
		{"spc negative capacity", "storage/StoragePoolClaim", `{capacity: -1Gi}`, "capacity must be greater than zero"},
		{"spc min > max", "storage/StoragePoolClaim", `{capacity: 1Gi, minPools: 3, maxPools: 2}`, "minPools must be less than or equal to maxPools"},
		{"spc default min > max", "storage/StoragePoolClaim", `{capacity: 1Gi, maxPools: 1}`, ""},
		{"spc bad poolType", "storage/StoragePoolClaim", `{capacity: 1Gi, poolType: raid5}`, "spec.poolType"},
		{"spc bad backend", "storage/StoragePoolClaim", `{capacity: 1Gi, backend: ceph}`, "spec.backend"},

		{"csp ok", "storage/CStorPool", `{nodeName: node-a, claim: claim-a, capacity: 1Gi}`, ""},
		{"csp no node", "storage/CStorPool", `{claim: claim-a, capacity: 1Gi}`, "spec.nodeName"},
		{"csp empty claim", "storage/CStorPool", `{nodeName: node-a, claim: "", capacity: 1Gi}`, "spec.claim"},

		{"cv ok", "storage/CStorVolume", `{capacity: 1Gi}`, ""},
		{"cv cf with default rf", "storage/CStorVolume", `{capacity: 1Gi, consistencyFactor: 3}`, ""},
		{"cv cf > default rf", "storage/CStorVolume", `{capacity: 1Gi, consistencyFactor: 4}`, "consistencyFactor must be less than or equal to replicationFactor"},
		{"cv cf > rf", "storage/CStorVolume", `{capacity: 1Gi, replicationFactor: 1, consistencyFactor: 2}`, "consistencyFactor must be"},
		{"cv cf zero", "storage/CStorVolume", `{capacity: 1Gi, consistencyFactor: 0}`, "spec.consistencyFactor"},
		{"cv rf too big", "storage/CStorVolume", `{capacity: 1Gi, replicationFactor: 6}`, "spec.replicationFactor"},

		{"cvr ok", "storage/CStorVolumeReplica", `{volume: vol-a, pool: pool-a, nodeName: node-a, capacity: 1Gi}`, ""},
		{"cvr no capacity", "storage/CStorVolumeReplica", `{volume: vol-a, pool: pool-a, nodeName: node-a}`, "spec.capacity"},

		{"pr ok", "scm/PullRequest", `{user: u, branch: b, status: open, id: 1, repository: o/r, number: 1}`, ""},
		{"pr bad status", "scm/PullRequest", `{user: u, branch: b, status: merged, id: 1, repository: o/r, number: 1}`, "spec.status"},
		{"pr bad repository", "scm/PullRequest", `{user: u, branch: b, status: open, id: 1, repository: r, number: 1}`, "repository must be owner/name"},
		{"pr number zero", "scm/PullRequest", `{user: u, branch: b, status: open, id: 1, repository: o/r, number: 0}`, "spec.number"},
		{"pr bad sha", "scm/PullRequest", `{user: u, branch: b, status: open, id: 1, repository: o/r, number: 1, headSha: ABC}`, "headSha must be"},
		{"pr no id", "scm/PullRequest", `{user: u, branch: b, status: open, repository: o/r, number: 1}`, "spec.id"},

		{"branch ok", "scm/Branch", `{name: main, state: pushed, repository: o/r, headSha: "0000000000000000000000000000000000000000"}`, ""},
		{"branch bad state", "scm/Branch", `{name: main, state: merged, repository: o/r}`, "spec.state"},

		{"btc ok", "bitcoin/BitcoinNetwork", `{nodes: 3, network: testnet}`, ""},
		{"btc too many nodes", "bitcoin/BitcoinNetwork", `{nodes: 11}`, "spec.nodes"},
		{"btc bad network", "bitcoin/BitcoinNetwork", `{network: signet}`, "spec.network"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := admit(t, vs, object(t, tc.kind, tc.spec), nil)
			checkErrs(t, errs, tc.wantErr)
		})
	}
}

func TestImmutability(t *testing.T) {
	vs := loadValidators(t)
	for _, tc := range []struct {
		name, kind, old, new, wantErr string
	}{
		{"spc poolType", "storage/StoragePoolClaim", `{capacity: 1Gi}`, `{capacity: 1Gi, poolType: mirrored}`, "poolType is immutable"},
		{"spc backend", "storage/StoragePoolClaim", `{capacity: 1Gi, backend: file}`, `{capacity: 1Gi, backend: zfs}`, "backend is immutable"},
		{"spc scale", "storage/StoragePoolClaim", `{capacity: 1Gi, maxPools: 2}`, `{capacity: 1Gi, minPools: 2, maxPools: 4}`, ""},
		{"csp node", "storage/CStorPool", `{nodeName: node-a, claim: claim-a, capacity: 1Gi}`, `{nodeName: node-b, claim: claim-a, capacity: 1Gi}`, "nodeName is immutable"},
		{"csp claim", "storage/CStorPool", `{nodeName: node-a, claim: claim-a, capacity: 1Gi}`, `{nodeName: node-a, claim: claim-b, capacity: 1Gi}`, "claim is immutable"},
		{"cv capacity", "storage/CStorVolume", `{capacity: 1Gi}`, `{capacity: 2Gi}`, "capacity is immutable"},
		{"cv rf", "storage/CStorVolume", `{capacity: 1Gi}`, `{capacity: 1Gi, replicationFactor: 5}`, "replicationFactor is immutable"},
		{"cv rf explicit default", "storage/CStorVolume", `{capacity: 1Gi}`, `{capacity: 1Gi, replicationFactor: 3}`, ""},
		{"cvr node", "storage/CStorVolumeReplica", `{volume: vol-a, pool: pool-a, nodeName: node-a, capacity: 1Gi}`, `{volume: vol-a, pool: pool-a, nodeName: node-b, capacity: 1Gi}`, "nodeName is immutable"},
		{"cvr pool", "storage/CStorVolumeReplica", `{volume: vol-a, pool: pool-a, nodeName: node-a, capacity: 1Gi}`, `{volume: vol-a, pool: pool-b, nodeName: node-a, capacity: 1Gi}`, "pool is immutable"},
		{"pr number", "scm/PullRequest", `{user: u, branch: b, status: open, id: 1, repository: o/r, number: 1}`, `{user: u, branch: b, status: open, id: 1, repository: o/r, number: 2}`, "number is immutable"},
		{"pr close", "scm/PullRequest", `{user: u, branch: b, status: open, id: 1, repository: o/r, number: 1}`, `{user: u, branch: b, status: closed, merged: true, id: 1, repository: o/r, number: 1}`, ""},
		{"branch repo", "scm/Branch", `{name: main, state: pushed, repository: o/r}`, `{name: main, state: pushed, repository: o/s}`, "repository is immutable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := admit(t, vs, object(t, tc.kind, tc.new), object(t, tc.kind, tc.old))
			checkErrs(t, errs, tc.wantErr)
		})
	}
}

func TestBitcoinNetworkDefaults(t *testing.T) {
	vs := loadValidators(t)
	obj := parse(t, `{apiVersion: bitcoin.crdipc.io/v1alpha1, kind: BitcoinNetwork, metadata: {name: n}}`)
	if errs := admit(t, vs, obj, nil); len(errs) > 0 {
		t.Fatalf("BitcoinNetwork without spec rejected: %v", errs.ToAggregate())
	}
	spec, _ := obj["spec"].(map[string]any)
	if spec["nodes"] != int64(2) || spec["network"] != string(bitcoinv1alpha1.NetworkRegtest) ||
		spec["image"] != bitcoinv1alpha1.DefaultImage {
		t.Fatalf("defaults not applied to a missing spec (or differ from the Go constants): %v", spec)
	}
}

// The operator falls back to Go constants for objects not yet defaulted; they must match the CRD.
func TestCStorVolumeDefaultsMatchGo(t *testing.T) {
	vs := loadValidators(t)
	obj := object(t, "storage/CStorVolume", `{capacity: 1Gi}`)
	if errs := admit(t, vs, obj, nil); len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	rf := obj["spec"].(map[string]any)["replicationFactor"]
	if rf != int64(storagev1alpha1.DefaultReplicationFactor) {
		t.Fatalf("CRD default replicationFactor %v, Go DefaultReplicationFactor %d", rf, storagev1alpha1.DefaultReplicationFactor)
	}
}

// object builds a custom resource of kind "<group prefix>/<Kind>" with the given spec.
func object(t *testing.T, kind, spec string) map[string]any {
	t.Helper()
	group, k, _ := strings.Cut(kind, "/")
	return parse(t, "{apiVersion: "+group+".crdipc.io/v1alpha1, kind: "+k+
		", metadata: {name: x, namespace: default}, spec: "+spec+"}")
}

func checkErrs(t *testing.T, errs field.ErrorList, want string) {
	t.Helper()
	if want == "" {
		if len(errs) > 0 {
			t.Fatalf("rejected: %v", errs.ToAggregate())
		}
		return
	}
	if len(errs) == 0 {
		t.Fatalf("accepted, want an error containing %q", want)
	}
	if msg := errs.ToAggregate().Error(); !strings.Contains(msg, want) {
		t.Fatalf("error %q does not contain %q", msg, want)
	}
}
