package controlplane

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"
	"k8s.io/client-go/tools/cache"
)

// customResourceStorage wraps the RESTOptionsGetter of custom resources: their storage
// decodes through sets, which share the managedFields trees (fieldsets.go), and the watch
// cache of each resource in indexes keeps an index of those selectable fields
// (fieldindex.go).
func customResourceStorage(getter generic.RESTOptionsGetter, sets *fieldSets, indexes map[schema.GroupResource][]string) generic.RESTOptionsGetter {
	return customResourceStorageGetter{RESTOptionsGetter: getter, sets: sets, indexes: indexes}
}

type customResourceStorageGetter struct {
	generic.RESTOptionsGetter
	sets    *fieldSets
	indexes map[schema.GroupResource][]string
}

func (g customResourceStorageGetter) GetRESTOptions(resource schema.GroupResource, example runtime.Object) (generic.RESTOptions, error) {
	opts, err := g.RESTOptionsGetter.GetRESTOptions(resource, example)
	if err != nil || opts.Decorator == nil {
		return opts, err
	}
	paths := g.indexes[resource]
	// The codec is final only when the decorator is called: apiextensions replaces it
	// (schema coercion, versioning) after this getter returns.
	decorate := opts.Decorator
	opts.Decorator = func(config *storagebackend.ConfigForResource, resourcePrefix string,
		keyFunc func(runtime.Object) (string, error), newFunc, newListFunc func() runtime.Object,
		getAttrs storage.AttrFunc, triggers storage.IndexerFuncs, indexers *cache.Indexers,
	) (storage.Interface, factory.DestroyFunc, error) {
		c := *config
		c.Codec = sharingCodec{Codec: config.Codec, sets: g.sets}
		if len(paths) == 0 {
			return decorate(&c, resourcePrefix, keyFunc, newFunc, newListFunc, getAttrs, triggers, indexers)
		}
		s, destroy, err := decorate(&c, resourcePrefix, keyFunc, newFunc, newListFunc, getAttrs, triggers, withFieldIndexes(indexers, paths))
		if err != nil {
			return s, destroy, err
		}
		return indexedLists{Interface: s, fields: paths}, destroy, nil
	}
	return opts, nil
}
