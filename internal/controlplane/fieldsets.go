package controlplane

import (
	"slices"
	"strconv"
	"sync"
	"unique"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The API server holds every custom resource in its watch cache as unstructured maps, and
// the field manager's record of who set which field (metadata.managedFields[].fieldsV1) is a
// tree of maps there too: about 5 KB of a Book's 9, at 100,000 Books half a GiB, and
// nearly all of it the same tree in every object of a kind (same manager, same fields).
// Typed objects keep fieldsV1 as raw bytes and are not affected.
//
// sharingCodec (installed by customResourceStorage) decodes custom resources from etcd as
// the API server does and then replaces each fieldsV1 tree by an identical one already
// held, so that one copy serves every object with those fields. The trees are read-only once decoded: whatever changes
// an object (an update, a conversion, the field manager) works on a deep copy or builds
// new maps, as it must anyway, because the watch cache hands the same object to every
// watcher.

// fieldSetsMaxBytes bounds the keys fieldSets holds; the trees under them take about as
// much again. A kind's few distinct trees take a few KB.
const fieldSetsMaxBytes = 4 << 20

// sharingCodec shares the fieldsV1 trees of the unstructured objects it decodes.
type sharingCodec struct {
	runtime.Codec
	sets *fieldSets
}

func (c sharingCodec) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	obj, gvk, err := c.Codec.Decode(data, defaults, into)
	if err != nil {
		return obj, gvk, err
	}
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		c.sets.shareObject(o.Object)
	case *unstructured.UnstructuredList:
		for i := range o.Items {
			c.sets.shareObject(o.Items[i].Object)
		}
	}
	return obj, gvk, nil
}

// fieldSets holds one copy of each fieldsV1 tree (and of each of its subtrees) seen. It
// forgets everything once its keys pass maxBytes, so that trees unique to one object (an
// owner reference's UID is a key) cannot make it grow without bound; objects keep the
// copies they were given.
type fieldSets struct {
	mu       sync.Mutex
	byKey    map[string]map[string]any
	bytes    int
	maxBytes int
	// buf holds the key being built, under mu.
	buf []byte
}

func newFieldSets(maxBytes int) *fieldSets {
	return &fieldSets{byKey: map[string]map[string]any{}, maxBytes: maxBytes}
}

// shareObject replaces, in an object's metadata, each managedFields entry's fieldsV1 by the
// held copy and each of the entry's strings by a canonical one. Anything not shaped as the
// API defines it is left as it is.
func (s *fieldSets) shareObject(obj map[string]any) {
	meta, ok := obj["metadata"].(map[string]any)
	if !ok {
		return
	}
	entries, ok := meta["managedFields"].([]any)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() {
		if cap(s.buf) > 64<<10 {
			s.buf = nil // an odd, huge tree's key is not kept for the next
		}
	}()
	for _, e := range entries {
		entry, ok := e.(map[string]any)
		if !ok {
			continue
		}
		for k, v := range entry {
			switch v := v.(type) {
			case string:
				entry[k] = unique.Make(v).Value()
			case map[string]any:
				if k == "fieldsV1" {
					s.buf = s.buf[:0]
					if shared, ok := s.share(v); ok {
						entry[k] = shared
					}
				}
			}
		}
	}
}

// share returns the held tree equal to m, holding m if there is none. Its key, appended to
// s.buf, is m's names, sorted, each with its length and its subtree's key; the subtrees'
// keys are built in place inside it, and a tree already held costs no new string. ok is
// false if m holds anything but maps, as fieldsV1 never does.
func (s *fieldSets) share(m map[string]any) (shared map[string]any, ok bool) {
	start := len(s.buf)
	s.buf = append(s.buf, '{')
	// Most maps of a fieldsV1 tree have a few names: their slices stay on the stack.
	var namesBuf [8]string
	var childrenBuf [8]map[string]any
	names := namesBuf[:0]
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	children := childrenBuf[:0]
	for _, name := range names {
		child, ok := m[name].(map[string]any)
		if !ok {
			return nil, false
		}
		// name's length first: no name can then be mistaken for another's end.
		s.buf = strconv.AppendInt(s.buf, int64(len(name)), 10)
		s.buf = append(s.buf, ':')
		s.buf = append(s.buf, name...)
		sharedChild, ok := s.share(child)
		if !ok {
			return nil, false
		}
		children = append(children, sharedChild)
	}
	s.buf = append(s.buf, '}')
	key := s.buf[start:]
	if held, ok := s.byKey[string(key)]; ok {
		return held, true
	}
	// m becomes the held copy: its children are the held ones, its names canonical.
	fresh := make(map[string]any, len(names))
	for i, name := range names {
		fresh[unique.Make(name).Value()] = children[i]
	}
	if s.bytes+len(key) > s.maxBytes {
		s.byKey, s.bytes = map[string]map[string]any{}, 0
	}
	s.byKey[string(key)] = fresh
	s.bytes += len(key)
	return fresh, true
}
