package controlplane

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/client-go/tools/cache"
)

// The API server's watch cache keeps an index of each selectable field of crdipc's own
// kinds (customResourceStorage installs it), so that a list that selects one value exactly
// (a field selector spec.volume=v) starts from the objects in that index instead of every
// object of the kind. Upstream indexes only fields of built-in kinds (a pod's
// spec.nodeName); for a custom resource the cache evaluates every object's selectable
// fields (JSONPath) against the selector: the node agent's list of a new replica's peers
// scanned every replica in the namespace, a cost that grew with the volumes of the
// cluster. The index only narrows what the cache then filters as before, so what a list
// returns is unchanged.

// selectableFieldIndexes are the selectable fields of the given CRDs by resource: those of
// CRDs with a single version, whose stored objects are the version the fields' paths
// describe, and whose paths are plain (.a.b).
func selectableFieldIndexes(crds []*apiextensionsv1.CustomResourceDefinition) map[schema.GroupResource][]string {
	out := map[schema.GroupResource][]string{}
	for _, c := range crds {
		if len(c.Spec.Versions) != 1 {
			continue
		}
		gr := schema.GroupResource{Group: c.Spec.Group, Resource: c.Spec.Names.Plural}
		for _, f := range c.Spec.Versions[0].SelectableFields {
			path := strings.TrimPrefix(f.JSONPath, ".")
			if path == f.JSONPath || strings.ContainsAny(path, "[]*@$'\" ") || slices.Contains(strings.Split(path, "."), "") {
				continue
			}
			out[gr] = append(out[gr], path)
		}
	}
	return out
}

// withFieldIndexes is indexers plus an index of each of paths.
func withFieldIndexes(indexers *cache.Indexers, paths []string) *cache.Indexers {
	all := cache.Indexers{}
	if indexers != nil {
		maps.Copy(all, *indexers)
	}
	for _, p := range paths {
		all[storage.FieldIndex(p)] = fieldValueIndex(p)
	}
	return &all
}

// fieldValueIndex indexes an object by the value at path as the API server's field
// selectors see a custom resource's selectable field: the value printed (fmt.Sprint), or
// "" where there is none.
func fieldValueIndex(path string) cache.IndexFunc {
	keys := strings.Split(path, ".")
	return func(obj any) ([]string, error) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return nil, fmt.Errorf("indexing %s: a %T, not an unstructured object", path, obj)
		}
		v, found, err := unstructured.NestedFieldNoCopy(u.Object, keys...)
		if err != nil || !found || v == nil {
			return []string{""}, nil
		}
		return []string{fmt.Sprint(v)}, nil
	}
}

// indexedLists tells the watch cache, on every list, which fields it may look up in its
// indexes: the registry of custom resources names none.
type indexedLists struct {
	storage.Interface
	fields []string
}

func (s indexedLists) GetList(ctx context.Context, key string, opts storage.ListOptions, listObj runtime.Object) error {
	opts.Predicate.IndexFields = append(slices.Clip(opts.Predicate.IndexFields), s.fields...)
	return s.Interface.GetList(ctx, key, opts, listObj)
}
