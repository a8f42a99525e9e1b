package backup_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/storage/backup"
)

// StressEnv sets how long TestPruneStress runs (a Go duration); 15 s without it. CI runs it
// for 2 minutes.
const StressEnv = "CRDIPC_BACKUP_STRESS"

// Against the real S3 server: backups of three volumes that change all the time (new data,
// and chunks drawn from a few contents, so that chunks come and go and come back), each volume
// keeping its last two backups; a prune every second, on a pending timeout of 3 s, so that an
// epoch is made every 3 s; restores of the newest backups all along. Every restore that
// starts from a manifest reads back what was backed up, and at the end verify finds nothing
// missing or damaged and every backup left restores.
func TestPruneStress(t *testing.T) {
	run := 15 * time.Second
	if s := os.Getenv(StressEnv); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s=%q: %v", StressEnv, s, err)
		}
		run = d
	}
	f := newFixtureWith(t, backup.InitOptions{ChunkSize: 64 << 10, PendingTimeout: 3 * time.Second})
	ctx, cancel := context.WithTimeout(t.Context(), run)
	defer cancel()

	const (
		volumes = 3
		volLen  = 2 << 20 // 32 chunks
	)
	palette := make([][]byte, 48)
	for i := range palette {
		palette[i] = randomBytes(t, 64<<10)
	}
	var (
		mu   sync.Mutex
		want = map[string][]byte{} // backup ID → what it holds
		kept = map[int][]string{}  // volume → its backups, oldest first

		backups, backupsFailed, deleted, epochs, waits, restores, restoresRefused atomic.Int64
	)
	fail := func(format string, a ...any) {
		t.Errorf(format, a...)
		cancel()
	}
	var wg sync.WaitGroup
	for vi := range volumes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mrand.New(mrand.NewPCG(uint64(vi), uint64(time.Now().UnixNano())))
			vol := make([]byte, volLen)
			for n := 0; ctx.Err() == nil; n++ {
				// The volume changes: a few chunks take another content, or zeros.
				for range 1 + rng.IntN(6) {
					c := rng.IntN(volLen / (64 << 10))
					switch rng.IntN(5) {
					case 0:
						clear(vol[c*64<<10 : (c+1)*64<<10])
					case 1: // new data, never seen before
						for i := c * 64 << 10; i < (c+1)*64<<10; i += 8 {
							binary.LittleEndian.PutUint64(vol[i:], rng.Uint64())
						}
					default:
						copy(vol[c*64<<10:], palette[rng.IntN(len(palette))])
					}
				}
				snap := bytes.Clone(vol)
				id := fmt.Sprintf("vol%d-%d", vi, n)
				mu.Lock()
				want[id] = snap
				mu.Unlock()
				if _, err := f.repo.Backup(ctx, bytes.NewReader(snap), volLen, backup.BackupOptions{ID: id, Volume: fmt.Sprint("ns/vol", vi), Concurrency: 4}); err != nil {
					if ctx.Err() == nil {
						t.Logf("backup %s: %v", id, err)
					}
					backupsFailed.Add(1)
					continue
				}
				backups.Add(1)
				mu.Lock()
				kept[vi] = append(kept[vi], id)
				var drop []string
				if len(kept[vi]) > 2 {
					drop, kept[vi] = kept[vi][:len(kept[vi])-2], kept[vi][len(kept[vi])-2:]
				}
				mu.Unlock()
				for _, old := range drop {
					if err := f.repo.Delete(ctx, old); err != nil && ctx.Err() == nil {
						fail("deleting backup %s: %v", old, err)
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // prunes, every second
		defer wg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			res, err := f.repo.Prune(ctx, backup.PruneOptions{})
			if err != nil {
				if ctx.Err() == nil {
					fail("prune: %v", err)
				}
				return
			}
			deleted.Add(int64(res.Deleted))
			if res.Epoch > 0 {
				epochs.Add(1)
			}
			if len(res.Waiting) > 0 {
				waits.Add(1)
			}
		}
	}()
	wg.Add(1)
	go func() { // restores of the newest backups
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			mu.Lock()
			ids := kept[i%volumes]
			id := ""
			if len(ids) > 0 {
				id = ids[len(ids)-1]
			}
			mu.Unlock()
			if id == "" { // no backup yet
				select {
				case <-ctx.Done():
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			var out memWriter
			_, err := f.repo.Restore(ctx, id, &out, backup.RestoreOptions{WriteZeros: true})
			var ce *backup.ChunkError
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, backup.ErrNotFound) && !errors.As(err, &ce):
				// Deleted (kept no longer) before the restore read its manifest.
				restoresRefused.Add(1)
			case errors.As(err, &ce) && strings.Contains(err.Error(), "being pruned"):
				// Refused before reading: its chunk's only copies were being pruned when a
				// prune that then found a backup running made its epoch.
				restoresRefused.Add(1)
			case err != nil:
				fail("restore of %s: %v", id, err)
				return
			default:
				mu.Lock()
				w := want[id]
				mu.Unlock()
				if !bytes.Equal(out.bytes(), w) {
					fail("backup %s restored to other data", id)
					return
				}
				restores.Add(1)
			}
		}
	}()
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Logf("%s: %d backups (%d failed), %d epochs, %d prunes waited, %d chunks deleted, %d restores (%d of backups deleted first)",
		run, backups.Load(), backupsFailed.Load(), epochs.Load(), waits.Load(), deleted.Load(), restores.Load(), restoresRefused.Load())

	ctx = t.Context()
	rep, err := f.repo.Verify(ctx, 8)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Bad) != 0 || rep.Damaged != 0 {
		t.Fatalf("verify after the stress: %d bad chunks (%v), %d damaged copies", len(rep.Bad), rep.Bad, rep.Damaged)
	}
	t.Logf("verify: %d backups, %d chunks, nothing missing or damaged", rep.Backups, rep.Chunks)
	list, err := f.repo.Backups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range list {
		if got := f.restored(t, f.repo, m.ID); !bytes.Equal(got, want[m.ID]) {
			t.Fatalf("backup %s restores to other data", m.ID)
		}
	}
	if backups.Load() == 0 || deleted.Load() == 0 || restores.Load() == 0 {
		t.Fatal("the stress did not back up, prune and restore")
	}
}
