package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Manifest is one backup: the volume's chunks in order. It is stored encrypted.
type Manifest struct {
	ID string `json:"id"`
	// Volume names what was backed up (for crdipc, namespace/claim); Source the snapshot
	// it was read from; Parent the backup this one was made against.
	Volume string            `json:"volume"`
	Source string            `json:"source,omitempty"`
	Parent string            `json:"parent,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Created is when the backup began.
	Created   time.Time `json:"created"`
	Size      int64     `json:"size"`
	ChunkSize int       `json:"chunkSize"`
	// Chunks are the chunk names, in volume order; "" is a chunk of zeros (not stored).
	Chunks []string `json:"chunks"`
	Stats  Stats    `json:"stats"`
}

// Stats count what a backup read and wrote.
type Stats struct {
	// Chunks is how many the volume has; Zero of them held only zeros.
	Chunks, Zero int64
	// Uploaded chunks were not in the store yet; their stored (compressed, encrypted)
	// bytes. Reused chunks were: the parent's, or another backup's.
	Uploaded, UploadedBytes, Reused int64
}

// checkID: IDs become object keys; they are DNS-1123 subdomains (Kubernetes object names,
// UIDs) so that no key escapes its prefix.
func checkID(id string) error {
	if errs := validation.IsDNS1123Subdomain(id); len(errs) > 0 {
		return fmt.Errorf("backup ID %q: %s", id, strings.Join(errs, "; "))
	}
	return nil
}

func manifestKey(id string) string { return backupsPrefix + id + manifestSuffix }

func (r *Repository) putManifest(ctx context.Context, m *Manifest) error {
	data, err := json.Marshal(m)
	if err != nil {
		return err
	}
	key := manifestKey(m.ID)
	r.mu.Lock()
	delete(r.manifests, m.ID)
	r.mu.Unlock()
	return r.store.Put(ctx, key, r.keys.seal(nil, data, key))
}

// Manifest reads backup id's manifest; ErrNotFound if there is no such backup.
func (r *Repository) Manifest(ctx context.Context, id string) (*Manifest, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	key := manifestKey(id)
	data, err := r.store.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("backup %s in %s: %w", id, r.store, err)
	}
	plain, err := r.keys.open(data, key)
	if err != nil {
		return nil, fmt.Errorf("backup %s in %s: its manifest %w", id, r.store, err)
	}
	var m Manifest
	if err := json.Unmarshal(plain, &m); err != nil {
		return nil, fmt.Errorf("backup %s in %s: its manifest: %w", id, r.store, err)
	}
	if m.ID != id || m.ChunkSize <= 0 || int64(len(m.Chunks)) != chunksOf(m.Size, m.ChunkSize) {
		return nil, fmt.Errorf("backup %s in %s: its manifest does not describe it (id %q, %d chunks of %d for %d bytes)", id, r.store, m.ID, len(m.Chunks), m.ChunkSize, m.Size)
	}
	return &m, nil
}

// Backups reads every backup's manifest, oldest first: what a cluster that starts empty
// finds in the store. A manifest this Repository read before is not read again.
func (r *Repository) Backups(ctx context.Context) ([]*Manifest, error) {
	var objs []ObjectInfo
	err := r.store.List(ctx, backupsPrefix, func(o ObjectInfo) error {
		if _, ok := strings.CutSuffix(strings.TrimPrefix(o.Key, backupsPrefix), manifestSuffix); ok {
			objs = append(objs, o)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the backups in %s: %w", r.store, err)
	}
	var out []*Manifest
	seen := map[string]bool{}
	for _, o := range objs {
		id := strings.TrimSuffix(strings.TrimPrefix(o.Key, backupsPrefix), manifestSuffix)
		seen[id] = true
		// A manifest is written once: one read before, of the same size and time, is it.
		r.mu.Lock()
		c, ok := r.manifests[id]
		r.mu.Unlock()
		if ok && c.size == o.Size && c.modified.Equal(o.Modified) {
			m := *c.m
			out = append(out, &m)
			continue
		}
		m, err := r.Manifest(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue // deleted since the listing
		}
		if err != nil {
			return nil, err
		}
		r.mu.Lock()
		r.manifests[id] = cachedManifest{size: o.Size, modified: o.Modified, m: m}
		r.mu.Unlock()
		out = append(out, m)
	}
	r.mu.Lock()
	for id := range r.manifests {
		if !seen[id] {
			delete(r.manifests, id)
		}
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b *Manifest) int { return a.Created.Compare(b.Created) })
	return out, nil
}

// Delete deletes backup id (its manifest). Its chunks stay until Prune finds no other
// backup lists them.
func (r *Repository) Delete(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	r.mu.Lock()
	delete(r.manifests, id)
	r.mu.Unlock()
	if err := r.store.Delete(ctx, manifestKey(id)); err != nil {
		return fmt.Errorf("deleting backup %s from %s: %w", id, r.store, err)
	}
	return nil
}

// cachedManifest is a manifest read, with its object's size and time then.
type cachedManifest struct {
	size     int64
	modified time.Time
	m        *Manifest
}

func chunksOf(size int64, chunk int) int64 { return (size + int64(chunk) - 1) / int64(chunk) }
