package controlplane

import (
	"encoding/json"
	"fmt"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

const sharedBook = `{"apiVersion":"library.crdipc.io/v1alpha1","kind":"Book","metadata":{"name":%q,
"managedFields":[
 {"apiVersion":"library.crdipc.io/v1alpha1","fieldsType":"FieldsV1","manager":"crdipc","operation":"Update","subresource":"status","time":"2026-11-23T18:49:38Z",
  "fieldsV1":{"f:status":{".":{},"f:conditions":{".":{},"k:{\"type\":\"Ready\"}":{".":{},"f:message":{},"f:status":{},"f:type":{}}},"f:observedGeneration":{}}}},
 {"apiVersion":"library.crdipc.io/v1alpha1","fieldsType":"FieldsV1","manager":"writer","operation":"Update","time":"2026-11-23T18:49:37Z",
  "fieldsV1":%s}]},
"spec":{"title":"Dune"}}`

func decodeBook(t *testing.T, codec runtime.Codec, name, specFields string) *unstructured.Unstructured {
	t.Helper()
	data := []byte(fmt.Sprintf(sharedBook, name, specFields))
	obj, _, err := codec.Decode(data, nil, &unstructured.Unstructured{})
	if err != nil {
		t.Fatal(err)
	}
	return obj.(*unstructured.Unstructured)
}

func fieldsV1(t *testing.T, u *unstructured.Unstructured, i int) map[string]any {
	t.Helper()
	// Not NestedSlice: it returns a copy.
	entries := u.Object["metadata"].(map[string]any)["managedFields"].([]any)
	return entries[i].(map[string]any)["fieldsV1"].(map[string]any)
}

func same(a, b map[string]any) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// Two objects with the same fields get one copy of each tree; a tree that differs shares
// its equal subtrees; and what the objects say is unchanged.
func TestFieldSetsShareEqualTrees(t *testing.T) {
	codec := sharingCodec{Codec: unstructured.UnstructuredJSONScheme, sets: newFieldSets(fieldSetsMaxBytes)}
	titleOnly := `{"f:spec":{".":{},"f:title":{}}}`
	withAuthor := `{"f:spec":{".":{},"f:author":{},"f:title":{}}}`
	a := decodeBook(t, codec, "a", titleOnly)
	b := decodeBook(t, codec, "b", titleOnly)
	c := decodeBook(t, codec, "c", withAuthor)

	if !same(fieldsV1(t, a, 0), fieldsV1(t, b, 0)) || !same(fieldsV1(t, a, 1), fieldsV1(t, b, 1)) {
		t.Error("equal fieldsV1 trees of two objects are separate copies")
	}
	if !same(fieldsV1(t, a, 0), fieldsV1(t, c, 0)) {
		t.Error("the status trees of a and c are equal and not shared")
	}
	if same(fieldsV1(t, a, 1), fieldsV1(t, c, 1)) {
		t.Fatal("different spec trees were made one")
	}
	aTitle := fieldsV1(t, a, 1)["f:spec"].(map[string]any)["f:title"].(map[string]any)
	cAuthor := fieldsV1(t, c, 1)["f:spec"].(map[string]any)["f:author"].(map[string]any)
	if !same(aTitle, cAuthor) {
		t.Error("leaves ({}) are not shared")
	}

	for _, tc := range []struct {
		u    *unstructured.Unstructured
		name string
		spec string
	}{{a, "a", titleOnly}, {b, "b", titleOnly}, {c, "c", withAuthor}} {
		want := &unstructured.Unstructured{}
		if err := json.Unmarshal([]byte(fmt.Sprintf(sharedBook, tc.name, tc.spec)), &want.Object); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(tc.u.Object, want.Object) {
			t.Errorf("%s changed by sharing:\n got %v\nwant %v", tc.name, tc.u.Object, want.Object)
		}
	}
	// A deep copy, which is what anything that changes an object works on, owns its trees.
	cp := a.DeepCopy()
	if same(fieldsV1(t, cp, 1), fieldsV1(t, a, 1)) {
		t.Error("a deep copy shares its fieldsV1 with the original")
	}
}

// What is not a tree of maps is left alone, and the held trees are forgotten past the bound
// without changing what objects hold.
func TestFieldSetsLeaveOddShapesAndStayBounded(t *testing.T) {
	sets := newFieldSets(64)
	codec := sharingCodec{Codec: unstructured.UnstructuredJSONScheme, sets: sets}
	odd := decodeBook(t, codec, "odd", `{"f:spec":{"f:title":"not a map"}}`)
	if got := fieldsV1(t, odd, 1)["f:spec"].(map[string]any)["f:title"]; got != "not a map" {
		t.Errorf("odd tree changed: %v", got)
	}
	for i := range 20 {
		decodeBook(t, codec, "b", fmt.Sprintf(`{"f:spec":{"f:title%d":{}}}`, i))
		if sets.bytes > sets.maxBytes {
			t.Fatalf("held %d bytes of keys, bound %d", sets.bytes, sets.maxBytes)
		}
	}
	x := decodeBook(t, codec, "x", `{"f:spec":{"f:title":{}}}`)
	if _, ok := fieldsV1(t, x, 1)["f:spec"].(map[string]any)["f:title"]; !ok {
		t.Error("tree lost after the bound was passed")
	}
}

// BenchmarkDecode: what sharing adds to decoding a served Book (two managers), against the
// decode alone in the same run.
func BenchmarkDecode(b *testing.B) {
	data := []byte(fmt.Sprintf(sharedBook, "a", `{"f:metadata":{"f:annotations":{".":{},"f:note":{}}},"f:spec":{".":{},"f:author":{},"f:title":{}}}`))
	for _, tc := range []struct {
		name  string
		codec runtime.Codec
	}{
		{"alone", unstructured.UnstructuredJSONScheme},
		{"shared", sharingCodec{Codec: unstructured.UnstructuredJSONScheme, sets: newFieldSets(fieldSetsMaxBytes)}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := tc.codec.Decode(data, nil, &unstructured.Unstructured{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
