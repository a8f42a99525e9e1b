package backup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// VerifyReport is what Verify found.
type VerifyReport struct {
	// Backups and Chunks are how many were checked; Bytes the chunks' stored size.
	Backups, Chunks int
	Bytes           int64
	// Bad are the chunks that are missing or of which no copy reads back, each with the
	// backups that list it, in name order.
	Bad []ChunkError
	// Damaged are the copies found damaged, now recorded in the store (damaged/): the next
	// backup that holds such a chunk's contents uploads a good copy, and restores read
	// another copy if there is one.
	Damaged int
}

// Broken are the backups that a bad chunk breaks, in order.
func (v *VerifyReport) Broken() []string {
	var out []string
	for _, b := range v.Bad {
		out = append(out, b.Backups...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Verify reads back every chunk that a backup lists, decrypts it and checks it against
// its name, and records each copy it finds damaged (so that the next backup holding the
// chunk's contents uploads a good copy). It runs as a restore does: no prune deletes
// anything meanwhile. An error is returned for what stopped it (the store unreachable);
// damage is in the report.
func (r *Repository) Verify(ctx context.Context, concurrency int) (*VerifyReport, error) {
	if concurrency <= 0 {
		concurrency = 4
	}
	sess, err := r.openSession(ctx, restoringPrefix+randomID(), "verify", min(time.Minute, r.pendingTimeout/10))
	if err != nil {
		return nil, fmt.Errorf("verifying %s: %w", r.store, err)
	}
	defer sess.stop(ctx)
	backups, err := r.Backups(ctx)
	if err != nil {
		return nil, err
	}
	list, err := r.storedChunks(ctx)
	if err != nil {
		return nil, err
	}
	deleting := map[string]bool{}
	for _, k := range sess.ep.Deleting {
		deleting[k] = true
	}
	copies := list.byName()
	users := map[string][]string{} // chunk → the backups listing it
	for _, m := range backups {
		for _, c := range m.Chunks {
			if c != "" && (len(users[c]) == 0 || users[c][len(users[c])-1] != m.ID) {
				users[c] = append(users[c], m.ID)
			}
		}
	}
	rep := &VerifyReport{Backups: len(backups), Chunks: len(users)}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(concurrency)
	for name, ids := range users {
		g.Go(func() error {
			plain, damaged, err := r.verifyChunk(gctx, name, copies[name], list.damaged, deleting)
			mu.Lock()
			defer mu.Unlock()
			rep.Damaged += damaged
			var ce *ChunkError
			switch {
			case err == nil:
				rep.Bytes += int64(len(plain))
			case errors.As(err, &ce):
				ce.Backups = ids
				rep.Bad = append(rep.Bad, *ce)
			default:
				return fmt.Errorf("verifying %s: %w", r.store, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	slices.SortFunc(rep.Bad, func(a, b ChunkError) int { return strings.Compare(a.Chunk, b.Chunk) })
	return rep, nil
}

// verifyChunk reads the copies of chunk name until one reads back: first those not recorded
// as damaged, newest first, then the recorded ones (a record outlives a copy written again
// whole; one that reads back loses its record). It records each copy it finds damaged, and
// says how many.
func (r *Repository) verifyChunk(ctx context.Context, name string, cs []chunkCopy, recorded, deleting map[string]bool) ([]byte, int, error) {
	slices.SortFunc(cs, func(a, b chunkCopy) int {
		return cmp.Or(cmp.Compare(boolInt(recorded[a.Info.Key]), boolInt(recorded[b.Info.Key])), cmp.Compare(b.Gen, a.Gen))
	})
	damaged := 0
	err := error(&ChunkError{Chunk: name, Err: ErrNotFound})
	for _, c := range cs {
		if deleting[c.Info.Key] {
			continue // no manifest listed it when its prune decided; another copy is listed
		}
		var plain []byte
		plain, err = r.readCopy(ctx, name, c.Info.Key)
		var ce *ChunkError
		switch {
		case err == nil:
			if recorded[c.Info.Key] {
				if err := r.store.Delete(ctx, damagedKey(c.Info.Key)); err != nil {
					return nil, damaged, fmt.Errorf("verifying %s: %w", r.store, err)
				}
			}
			return plain, damaged, nil
		case !errors.As(err, &ce):
			return nil, damaged, err
		case errors.Is(err, ErrNotFound):
		default:
			damaged++
			if !recorded[c.Info.Key] {
				if err := r.markDamaged(ctx, c.Info.Key); err != nil {
					return nil, damaged, err
				}
			}
		}
	}
	return nil, damaged, err
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
