package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// defaultPendingTimeout: a backup whose marker was not renewed for this long is taken for
// dead (a backup renews it every minute, and stops if it could not for half of this).
const defaultPendingTimeout = 10 * time.Minute

// condemnation is what a prune's first pass leaves for its second.
type condemnation struct {
	// Marked is the store's time when the chunks were condemned: a chunk written after
	// it was uploaded again by a backup, and stays.
	Marked time.Time `json:"marked"`
	Chunks []string  `json:"chunks"`
	// Running are the backups that were running then: they may list a condemned chunk
	// without uploading it again, so the second pass waits until they are done.
	Running []string `json:"running,omitempty"`
}

type condemnedSet map[string]bool

func (c condemnedSet) has(name string) bool { return c[name] }

// condemned reads the chunks the last prune condemned.
func (r *Repository) condemned(ctx context.Context) (condemnedSet, error) {
	c, err := r.condemnation(ctx)
	if err != nil || c == nil {
		return nil, err
	}
	set := condemnedSet{}
	for _, n := range c.Chunks {
		set[n] = true
	}
	return set, nil
}

func (r *Repository) condemnation(ctx context.Context) (*condemnation, error) {
	data, err := r.store.Get(ctx, condemnedKey)
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s in %s: %w", condemnedKey, r.store, err)
	}
	var c condemnation
	if err := json.Unmarshal(data, &c); err != nil {
		return nil, fmt.Errorf("%s in %s is damaged: %w", condemnedKey, r.store, err)
	}
	return &c, nil
}

// PruneOptions configure Prune.
type PruneOptions struct {
	// PendingTimeout: a backup whose marker was not renewed for this long is taken for
	// dead; default (and most) 10 minutes.
	PendingTimeout time.Duration
}

// PruneResult is what a Prune did.
type PruneResult struct {
	// Deleted chunks (and their stored bytes) were condemned by the previous prune and
	// still listed by no backup. Revived ones were condemned but written again since.
	Deleted, Revived int
	DeletedBytes     int64
	// Condemned chunks are listed by no backup now: the next prune deletes them, unless a
	// backup lists or writes them by then.
	Condemned int
	// Waiting are the backups that were running when the previous prune condemned chunks
	// and still run: this prune deleted nothing.
	Waiting []string
}

// Prune deletes the chunks that no backup lists, without ever deleting one that a
// running backup counts on. It works in two passes, each a call of Prune:
//
//  1. It condemns the chunks no manifest lists (writes their names, with the store's time
//     and the backups running then). A backup that starts later reads the condemned names
//     and uploads such a chunk again rather than reuse it, which makes it newer than the
//     condemnation.
//  2. The next Prune, once every backup that was running at the condemnation has ended,
//     deletes the condemned chunks that are still listed by no manifest and were not
//     written since; then it condemns anew.
//
// A backup writes its marker before it reads the condemned names, and a prune lists the
// markers after it wrote them: so every backup either saw the condemnation or is listed
// as running in it.
func (r *Repository) Prune(ctx context.Context, o PruneOptions) (*PruneResult, error) {
	if o.PendingTimeout <= 0 || o.PendingTimeout > defaultPendingTimeout {
		o.PendingTimeout = defaultPendingTimeout
	}
	res := &PruneResult{}
	prev, err := r.condemnation(ctx)
	if err != nil {
		return nil, err
	}
	running, now, err := r.running(ctx, o.PendingTimeout)
	if err != nil {
		return nil, err
	}
	if prev != nil {
		for _, id := range prev.Running {
			if slices.Contains(running, id) {
				res.Waiting = append(res.Waiting, id)
			}
		}
		if len(res.Waiting) > 0 {
			return res, nil
		}
	}
	listed, err := r.listed(ctx)
	if err != nil {
		return nil, err
	}
	stored, err := r.storedChunks(ctx)
	if err != nil {
		return nil, err
	}
	if prev != nil {
		for _, name := range prev.Chunks {
			info, ok := stored[name]
			switch {
			case !ok || listed[name]:
			case !info.Modified.Before(prev.Marked.Truncate(time.Second)):
				// Written again since (a store may give its times to the second only:
				// one of the condemnation's own second counts as written since).
				res.Revived++
			default:
				if err := r.store.Delete(ctx, chunkKey(name)); err != nil {
					return nil, fmt.Errorf("pruning %s: %w", r.store, err)
				}
				delete(stored, name)
				res.Deleted++
				res.DeletedBytes += info.Size
			}
		}
	}
	next := condemnation{Marked: now}
	for name := range stored {
		if !listed[name] {
			next.Chunks = append(next.Chunks, name)
		}
	}
	slices.Sort(next.Chunks)
	res.Condemned = len(next.Chunks)
	// The names first, then the markers of the backups that may not have seen them.
	if err := r.putCondemnation(ctx, &next); err != nil {
		return nil, err
	}
	if next.Running, _, err = r.running(ctx, o.PendingTimeout); err != nil {
		return nil, err
	}
	if len(next.Running) > 0 {
		if err := r.putCondemnation(ctx, &next); err != nil {
			return nil, err
		}
	}
	return res, nil
}

func (r *Repository) putCondemnation(ctx context.Context, c *condemnation) error {
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if err := r.store.Put(ctx, condemnedKey, data); err != nil {
		return fmt.Errorf("pruning %s: %w", r.store, err)
	}
	return nil
}

// running lists the backups whose markers were renewed within timeout, by the store's
// clock, which it returns too (read from an object written now).
func (r *Repository) running(ctx context.Context, timeout time.Duration) ([]string, time.Time, error) {
	const clockKey = "prune/clock"
	if err := r.store.Put(ctx, clockKey, nil); err != nil {
		return nil, time.Time{}, fmt.Errorf("reading the clock of %s: %w", r.store, err)
	}
	clock, err := r.store.Stat(ctx, clockKey)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("reading the clock of %s: %w", r.store, err)
	}
	var ids []string
	err = r.store.List(ctx, pendingPrefix, func(o ObjectInfo) error {
		if clock.Modified.Sub(o.Modified) <= timeout {
			ids = append(ids, strings.TrimPrefix(o.Key, pendingPrefix))
		}
		return nil
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("listing the running backups of %s: %w", r.store, err)
	}
	return ids, clock.Modified, nil
}

// listed is the set of chunks some backup lists.
func (r *Repository) listed(ctx context.Context) (map[string]bool, error) {
	backups, err := r.Backups(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, m := range backups {
		for _, c := range m.Chunks {
			if c != "" {
				out[c] = true
			}
		}
	}
	return out, nil
}

// storedChunks lists the stored chunks by name.
func (r *Repository) storedChunks(ctx context.Context) (map[string]ObjectInfo, error) {
	out := map[string]ObjectInfo{}
	err := r.store.List(ctx, chunksPrefix, func(o ObjectInfo) error {
		if i := strings.LastIndexByte(o.Key, '/'); i >= 0 {
			out[o.Key[i+1:]] = o
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the chunks in %s: %w", r.store, err)
	}
	return out, nil
}
