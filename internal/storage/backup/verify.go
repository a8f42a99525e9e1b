package backup

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"
)

// VerifyReport is what Verify found.
type VerifyReport struct {
	// Backups and Chunks are how many were checked; Bytes the chunks' stored size.
	Backups, Chunks int
	Bytes           int64
	// Bad are the chunks that are missing or do not read back, each with the backups
	// that list it, in name order.
	Bad []ChunkError
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
// its name. An error is returned for what stopped it (the store unreachable); damage is
// in the report.
func (r *Repository) Verify(ctx context.Context, concurrency int) (*VerifyReport, error) {
	if concurrency <= 0 {
		concurrency = 4
	}
	backups, err := r.Backups(ctx)
	if err != nil {
		return nil, err
	}
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
			plain, err := r.readChunk(gctx, name)
			mu.Lock()
			defer mu.Unlock()
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
