package crd_test

import (
	"slices"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/crdipc/crdipc/config/crd"
)

func TestCRDsDecode(t *testing.T) {
	crds, err := crd.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"backupstores.storage.crdipc.io",
		"bitcoinnetworks.bitcoin.crdipc.io",
		"books.library.crdipc.io",
		"branches.scm.crdipc.io",
		"cstorpools.storage.crdipc.io",
		"cstorvolumereplicas.storage.crdipc.io",
		"cstorvolumes.storage.crdipc.io",
		"cstorvolumesnapshots.storage.crdipc.io",
		"deliveries.scm.crdipc.io",
		"pullrequests.scm.crdipc.io",
		"storagepoolclaims.storage.crdipc.io",
		"volumebackups.storage.crdipc.io",
		// Upstream's, as external-snapshotter ships them.
		"volumesnapshotclasses.snapshot.storage.k8s.io",
		"volumesnapshotcontents.snapshot.storage.k8s.io",
		"volumesnapshots.snapshot.storage.k8s.io",
	}
	var got []string
	for _, c := range crds {
		got = append(got, c.Name)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("embedded CRDs (sorted) = %v, want %v", got, want)
	}

	for _, c := range crds {
		if c.Spec.Group == "snapshot.storage.k8s.io" {
			// Upstream's CRDs, unchanged: a Kubernetes API group, approved upstream.
			if c.Annotations["api-approved.kubernetes.io"] == "" {
				t.Errorf("%s: no api-approved.kubernetes.io annotation: the API server refuses it", c.Name)
			}
			continue
		}
		if !slices.Contains(c.Spec.Names.Categories, "crdipc") {
			t.Errorf("%s: categories %v lack %q", c.Name, c.Spec.Names.Categories, "crdipc")
		}
		if len(c.Spec.Versions) != 1 || c.Spec.Versions[0].Name != "v1alpha1" {
			t.Errorf("%s: want exactly version v1alpha1, got %d versions", c.Name, len(c.Spec.Versions))
			continue
		}
		v := c.Spec.Versions[0]
		// A Delivery record is a write-once log entry, created with its status in one write.
		if hasStatus := v.Subresources != nil && v.Subresources.Status != nil; hasStatus != (c.Name != "deliveries.scm.crdipc.io") {
			t.Errorf("%s: status subresource %v", c.Name, hasStatus)
		}
		if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			t.Errorf("%s: schema missing", c.Name)
		}
	}
}

func TestSelectableNodeName(t *testing.T) {
	crds, err := crd.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cstorpools.storage.crdipc.io", "cstorvolumereplicas.storage.crdipc.io"} {
		i := slices.IndexFunc(crds, func(c *apiextensionsv1.CustomResourceDefinition) bool { return c.Name == name })
		if i < 0 {
			t.Fatalf("%s not embedded", name)
		}
		var paths []string
		for _, f := range crds[i].Spec.Versions[0].SelectableFields {
			paths = append(paths, f.JSONPath)
		}
		if !slices.Contains(paths, ".spec.nodeName") {
			t.Errorf("%s: selectableFields %v lack .spec.nodeName", name, paths)
		}
	}
}

func TestCRDsAreFresh(t *testing.T) {
	a, err := crd.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	a[0].Name = "mutated"
	b, err := crd.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	if b[0].Name == "mutated" {
		t.Fatal("CRDs returned shared objects; callers' changes leak into later calls")
	}
}
