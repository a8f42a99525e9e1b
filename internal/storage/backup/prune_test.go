package backup_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/storage/backup"
)

// The tests here run on a store in memory whose clock the test moves (the store's times are
// what prunes go by), past the default pending timeout of 10 minutes in no time.

const memChunk = 64 << 10

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type memFixture struct {
	clock *testClock
	store *backup.MemStore
	repo  *backup.Repository
}

func newMemFixture(t *testing.T) *memFixture {
	f := &memFixture{clock: &testClock{t: time.Now()}}
	f.store = backup.NewMemStore(f.clock.Now)
	var err error
	if f.repo, err = backup.Open(t.Context(), f.store, randomBytes(t, 32), backup.InitOptions{ChunkSize: memChunk}); err != nil {
		t.Fatal(err)
	}
	return f
}

// later moves the store's clock past the pending timeout, as a prune run an hour later
// finds it, and renews the markers of the backups and restores that run meanwhile (their
// heartbeats, every minute).
func (f *memFixture) later() {
	f.clock.advance(11 * time.Minute)
	f.store.Touch("pending/")
	f.store.Touch("restoring/")
}

type pruneTag struct{}

// prune runs a prune whose store operations the store's Hook can tell (pruneTag).
func (f *memFixture) prune(t *testing.T) (*backup.PruneResult, error) {
	return f.repo.Prune(context.WithValue(t.Context(), pruneTag{}, true), backup.PruneOptions{})
}

func (f *memFixture) mustRestore(t *testing.T, id string, want []byte) {
	t.Helper()
	var out memWriter
	m, err := f.repo.Restore(t.Context(), id, &out, backup.RestoreOptions{WriteZeros: true})
	if err != nil {
		t.Fatalf("backup %s does not restore: %v", id, err)
	}
	if int64(len(out.bytes())) != m.Size || !bytes.Equal(out.bytes(), want) {
		t.Fatalf("backup %s restores to other data", id)
	}
}

type memWriter struct {
	mu sync.Mutex
	b  []byte
}

func (w *memWriter) WriteAt(p []byte, off int64) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if need := off + int64(len(p)); need > int64(len(w.b)) {
		w.b = append(w.b, make([]byte, need-int64(len(w.b)))...)
	}
	return copy(w.b[off:], p), nil
}

func (w *memWriter) bytes() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b
}

// A prune that fails right after its first write of what it condemned (an S3 error, or the
// operator killed) leaves nothing that lets a later prune delete a chunk that a backup
// running since before reuses. (The old Prune stored its condemnation first with no backup
// running, then again with the running ones: the next prune deleted the reused chunks.)
func TestPruneThatFailsAfterCondemningDeletesNothingARunningBackupReuses(t *testing.T) {
	ctx := t.Context()
	f := newMemFixture(t)
	v := randomBytes(t, 4*memChunk)
	if _, err := f.repo.Backup(ctx, bytes.NewReader(v), int64(len(v)), backup.BackupOptions{ID: "old", Volume: "ns/data"}); err != nil {
		t.Fatal(err)
	}
	if err := f.repo.Delete(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	f.clock.advance(time.Minute)
	// A backup of the same data lists the stored chunks, reuses the old ones, and pauses.
	src := &gate{r: bytes.NewReader(v), at: memChunk, reached: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := f.repo.Backup(ctx, src, int64(len(v)), backup.BackupOptions{ID: "running", Volume: "ns/data", Concurrency: 1})
		done <- err
	}()
	<-src.reached

	// The first prune's second write under prune/ (the clock aside) fails.
	var writes atomic.Int32
	f.store.Hook = func(ctx context.Context, op, key string) backup.Fault {
		if ctx.Value(pruneTag{}) != nil && (op == "put" || op == "create") && strings.HasPrefix(key, "prune/") && key != "prune/clock" && writes.Add(1) > 1 {
			return backup.FailBefore
		}
		return backup.NoFault
	}
	res, err := f.prune(t)
	t.Logf("prune that fails after its first write: %+v, %v", res, err)
	f.store.Hook = nil
	for range 3 {
		f.later()
		res, err := f.prune(t)
		if err != nil {
			t.Fatal(err)
		}
		if res.Deleted != 0 {
			t.Fatalf("a prune while the backup runs: %+v; want nothing deleted", res)
		}
	}
	close(src.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	f.mustRestore(t, "running", v)
}

// A prune deletes no chunk that a backup uploaded again between the prune's listing and its
// deletions: the backup writes copies that no prune decided on. (The old Prune listed the
// chunks, then deleted the condemned ones that the listing showed unwritten since; a PUT of
// one in between was deleted.)
func TestPruneDeletesNoChunkUploadedAgainMeanwhile(t *testing.T) {
	ctx := t.Context()
	f := newMemFixture(t)
	v := randomBytes(t, 4*memChunk)
	if _, err := f.repo.Backup(ctx, bytes.NewReader(v), int64(len(v)), backup.BackupOptions{ID: "old", Volume: "ns/data"}); err != nil {
		t.Fatal(err)
	}
	if err := f.repo.Delete(ctx, "old"); err != nil {
		t.Fatal(err)
	}
	f.clock.advance(time.Minute)
	if _, err := f.prune(t); err != nil { // condemns the old chunks
		t.Fatal(err)
	}
	f.later()
	// The next prune, at its first deletion, waits while a backup of the same data runs
	// whole.
	var once sync.Once
	f.store.Hook = func(pctx context.Context, op, key string) backup.Fault {
		if pctx.Value(pruneTag{}) != nil && op == "delete" && strings.HasPrefix(key, "chunks/") {
			once.Do(func() {
				if _, err := f.repo.Backup(ctx, bytes.NewReader(v), int64(len(v)), backup.BackupOptions{ID: "new", Volume: "ns/data"}); err != nil {
					t.Error(err)
				}
			})
		}
		return backup.NoFault
	}
	res, err := f.prune(t)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the prune that deleted while a backup uploaded: %+v", res)
	f.mustRestore(t, "new", v)
}

// A restore keeps its chunks while it runs: a prune deletes nothing, though the backup is
// deleted meanwhile (keepLast, or a user). (Before, a restore left no marker: a fill from a
// backup that was deleted half way failed.)
func TestRestoreKeepsItsChunksFromPrunes(t *testing.T) {
	ctx := t.Context()
	f := newMemFixture(t)
	v := randomBytes(t, 4*memChunk)
	if _, err := f.repo.Backup(ctx, bytes.NewReader(v), int64(len(v)), backup.BackupOptions{ID: "b", Volume: "ns/data"}); err != nil {
		t.Fatal(err)
	}
	dst := &gatedWriter{reached: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := f.repo.Restore(ctx, "b", dst, backup.RestoreOptions{Concurrency: 1})
		done <- err
	}()
	<-dst.reached
	if err := f.repo.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		res, err := f.prune(t)
		if err != nil {
			t.Fatal(err)
		}
		if res.Deleted != 0 {
			t.Fatalf("a prune while a restore runs: %+v; want nothing deleted", res)
		}
		f.later()
	}
	close(dst.release)
	if err := <-done; err != nil {
		t.Fatalf("the restore of a backup deleted while it ran: %v", err)
	}
	if !bytes.Equal(dst.w.bytes(), v) {
		t.Fatal("the restore wrote other data")
	}
	// Once it ended, the chunks go.
	deleted := 0
	for range 3 {
		res, err := f.prune(t)
		if err != nil {
			t.Fatal(err)
		}
		deleted += res.Deleted
		f.later()
	}
	if deleted != 4 {
		t.Fatalf("prunes after the restore deleted %d chunks, want its 4", deleted)
	}
}

// gatedWriter waits at its first write until release, after saying so.
type gatedWriter struct {
	w       memWriter
	once    sync.Once
	reached chan struct{}
	release chan struct{}
}

func (g *gatedWriter) WriteAt(p []byte, off int64) (int, error) {
	g.once.Do(func() {
		close(g.reached)
		<-g.release
	})
	return g.w.WriteAt(p, off)
}

// Backups reads a manifest once: a store's sync, which lists the backups every time, reads
// only those that are new since (before, it read every manifest each time).
func TestBackupsReadsEachManifestOnce(t *testing.T) {
	ctx := t.Context()
	f := newMemFixture(t)
	var gets atomic.Int32
	f.store.Hook = func(_ context.Context, op, key string) backup.Fault {
		if op == "get" && strings.HasPrefix(key, "backups/") {
			gets.Add(1)
		}
		return backup.NoFault
	}
	v := randomBytes(t, memChunk)
	for _, id := range []string{"one", "two"} {
		if _, err := f.repo.Backup(ctx, bytes.NewReader(v), int64(len(v)), backup.BackupOptions{ID: id, Volume: "ns/" + id}); err != nil {
			t.Fatal(err)
		}
	}
	list := func(want string) {
		t.Helper()
		gets.Store(0)
		ms, err := f.repo.Backups(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
		if got := fmt.Sprint(ids, " ", gets.Load(), " read"); got != want {
			t.Fatalf("backups: %s, want %s", got, want)
		}
	}
	list("[one two] 2 read")
	list("[one two] 0 read")
	if err := f.repo.Delete(ctx, "one"); err != nil {
		t.Fatal(err)
	}
	f.clock.advance(time.Second)
	if _, err := f.repo.Backup(ctx, bytes.NewReader(v), int64(len(v)), backup.BackupOptions{ID: "three", Volume: "ns/three"}); err != nil {
		t.Fatal(err)
	}
	list("[two three] 1 read")
}
