package controlplane_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv"
)

// kube-apiserver builds its OpenAPI v2 document on first use (deferOpenAPIV2), and installs
// v3 itself: clients still read both, built-in kinds and custom resources alike, through
// the aggregator as before.
func TestOpenAPIServesBuiltInAndCustomKinds(t *testing.T) {
	env := testenv.Get(t)
	disco := env.Kube.Discovery()

	testenv.Eventually(t, 30*time.Second, "OpenAPI v2 with Pods and Books", func(context.Context) (bool, error) {
		doc, err := disco.OpenAPISchema()
		if err != nil {
			return false, err
		}
		var pod, book, podsPath bool
		for _, d := range doc.GetDefinitions().GetAdditionalProperties() {
			pod = pod || d.GetName() == "io.k8s.api.core.v1.Pod"
			book = book || d.GetName() == "io.crdipc.library.v1alpha1.Book"
		}
		for _, p := range doc.GetPaths().GetPath() {
			podsPath = podsPath || p.GetName() == "/api/v1/namespaces/{namespace}/pods"
		}
		if !pod || !podsPath {
			t.Fatalf("OpenAPI v2 without the built-in Pod (definition %v, path %v)", pod, podsPath)
		}
		return book, nil
	})

	paths, err := disco.OpenAPIV3().Paths()
	if err != nil {
		t.Fatal(err)
	}
	for _, gv := range []string{"api/v1", "apis/apps/v1", "apis/library.crdipc.io/v1alpha1"} {
		p, ok := paths[gv]
		if !ok {
			t.Errorf("OpenAPI v3 has no %s", gv)
			continue
		}
		schema, err := p.Schema("application/json")
		if err != nil {
			t.Errorf("OpenAPI v3 %s: %v", gv, err)
			continue
		}
		if !strings.Contains(string(schema), `"components"`) {
			t.Errorf("OpenAPI v3 %s has no components: %.200s", gv, schema)
		}
	}
}
