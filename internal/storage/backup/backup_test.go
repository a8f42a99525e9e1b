package backup_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/storage/backup"
	"github.com/crdipc/crdipc/internal/storage/backup/s3local"
	"github.com/crdipc/crdipc/internal/testenv/s3server"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

const (
	chunk   = 256 << 10
	volSize = 32 << 20
)

type fixture struct {
	srv   *s3local.Server
	store backup.Store
	key   []byte
	repo  *backup.Repository
}

// newFixture starts a real S3 server and opens a store in a new bucket of it.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureWith(t, backup.InitOptions{ChunkSize: chunk})
}

func newFixtureWith(t *testing.T, o backup.InitOptions) *fixture {
	t.Helper()
	srv := s3server.Start(t)
	store, err := backup.NewS3(t.Context(), backup.S3Options{
		Endpoint: srv.Endpoint, Bucket: "backups", Prefix: "cluster-a", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey,
		Insecure: true, CreateBucket: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{srv: srv, store: store, key: randomBytes(t, 32)}
	if f.repo, err = backup.Open(t.Context(), store, f.key, o); err != nil {
		t.Fatal(err)
	}
	return f
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// volume is random data with a hole of zeros, as a volume with free space has.
func volume(t *testing.T) []byte {
	v := randomBytes(t, volSize)
	clear(v[8<<20 : 16<<20])
	return v
}

// objects counts the bucket's files, as the S3 server keeps them.
func (f *fixture) objects(t *testing.T) int {
	n := 0
	err := filepath.WalkDir(filepath.Join(f.srv.Dir, "backups"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			n++
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// restored restores backup id into a new file and returns its contents.
func (f *fixture) restored(t *testing.T, repo *backup.Repository, id string) []byte {
	t.Helper()
	dst, err := os.Create(filepath.Join(t.TempDir(), "restored"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	m, err := repo.Restore(t.Context(), id, dst, backup.RestoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := dst.Truncate(m.Size); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dst.Name())
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A backup stores only non-zero chunks; a second one of the volume with 1% changed
// uploads the changed chunks only (≤ 2% of the volume); a backup of another volume that
// shares chunks uploads only its own; each restores byte for byte, also through a store
// opened anew from the bucket and the key alone.
func TestBackupIsIncrementalDeduplicatedAndRestores(t *testing.T) {
	ctx := t.Context()
	f := newFixture(t)
	v := volume(t)
	m1, err := f.repo.Backup(ctx, bytes.NewReader(v), volSize, backup.BackupOptions{ID: "b1", Volume: "ns/data"})
	if err != nil {
		t.Fatal(err)
	}
	zero := int64(8<<20) / chunk
	if m1.Stats.Zero != zero || m1.Stats.Uploaded != m1.Stats.Chunks-zero {
		t.Fatalf("first backup: %+v, want %d zero chunks and the others uploaded", m1.Stats, zero)
	}
	t.Logf("first backup: %+v, %d objects in the bucket", m1.Stats, f.objects(t))

	// 1% of the volume, contiguous, from a chunk boundary.
	changed := int64(volSize / 100)
	copy(v[20<<20:], randomBytes(t, int(changed)))
	m2, err := f.repo.Backup(ctx, bytes.NewReader(v), volSize, backup.BackupOptions{ID: "b2", Volume: "ns/data", Parent: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	if limit := int64(volSize) * 2 / 100; m2.Stats.UploadedBytes > limit {
		t.Fatalf("the backup after a 1%% change uploaded %d bytes, more than 2%% of the volume (%d): %+v", m2.Stats.UploadedBytes, limit, m2.Stats)
	}
	t.Logf("incremental backup after changing %d bytes: %+v (%.2f%% of the volume)", changed, m2.Stats, 100*float64(m2.Stats.UploadedBytes)/volSize)

	// Another volume: the first half is the same data.
	other := randomBytes(t, volSize)
	copy(other, v[:volSize/2])
	m3, err := f.repo.Backup(ctx, bytes.NewReader(other), volSize, backup.BackupOptions{ID: "other-1", Volume: "ns/other"})
	if err != nil {
		t.Fatal(err)
	}
	if half := int64(volSize/2) / chunk; m3.Stats.Uploaded != half || m3.Stats.Reused+m3.Stats.Zero != half {
		t.Fatalf("a volume sharing half its chunks: %+v, want %d uploaded and %d found", m3.Stats, half, half)
	}

	// Asked again, a backup that exists is returned, nothing uploaded.
	again, err := f.repo.Backup(ctx, bytes.NewReader(v), volSize, backup.BackupOptions{ID: "b2", Volume: "ns/data", Parent: "b1"})
	if err != nil || again.Stats != m2.Stats {
		t.Fatalf("b2 again: %+v, %v", again, err)
	}

	// Disaster recovery: nothing but the bucket and the key.
	fresh, err := backup.OpenExisting(ctx, f.store, f.key)
	if err != nil {
		t.Fatal(err)
	}
	list, err := fresh.Backups(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range list {
		ids = append(ids, m.ID+"="+m.Volume)
	}
	if got := strings.Join(ids, " "); got != "b1=ns/data b2=ns/data other-1=ns/other" {
		t.Fatalf("backups found in the bucket: %s", got)
	}
	for id, want := range map[string][]byte{"b2": v, "other-1": other} {
		if got := f.restored(t, fresh, id); sha256.Sum256(got) != sha256.Sum256(want) {
			t.Fatalf("backup %s restored is not the volume backed up", id)
		}
	}
}

// The bucket holds no plaintext: a pattern written all over the volume is found in no
// object, and the wrong key opens nothing.
func TestBucketHoldsNoPlaintextAndAWrongKeyIsRefused(t *testing.T) {
	ctx := t.Context()
	f := newFixture(t)
	pattern := []byte("crdipc-known-plaintext-pattern:")
	v := bytes.Repeat(pattern, volSize/len(pattern)+1)[:volSize]
	if _, err := f.repo.Backup(ctx, bytes.NewReader(v), volSize, backup.BackupOptions{ID: "secret", Volume: "ns/secret-data"}); err != nil {
		t.Fatal(err)
	}
	err := filepath.WalkDir(f.srv.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, needle := range [][]byte{pattern[:16], []byte("secret-data")} {
			if bytes.Contains(data, needle) {
				t.Errorf("%s holds %q in plaintext", p, needle)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	_, err = backup.OpenExisting(ctx, f.store, randomBytes(t, 32))
	if !errors.Is(err, backup.ErrWrongKey) || !strings.Contains(err.Error(), f.store.String()) {
		t.Fatalf("opened with another key: %v; want ErrWrongKey naming the store", err)
	}
	// Open of a store that exists never makes it anew, whatever the key: the configuration
	// is written only where there is none (a conditional write).
	if _, err := backup.Open(ctx, f.store, randomBytes(t, 32), backup.InitOptions{}); !errors.Is(err, backup.ErrWrongKey) {
		t.Fatalf("Open with another key: %v; want ErrWrongKey", err)
	}
	if err := f.store.Create(ctx, "crdipc-backup.json", []byte("{}")); !errors.Is(err, backup.ErrExists) {
		t.Fatalf("a conditional write over the configuration: %v; want ErrExists", err)
	}
	if _, err := backup.OpenExisting(ctx, f.store, f.key); err != nil {
		t.Fatalf("the store after a refused overwrite: %v", err)
	}
	if _, err := backup.OpenExisting(ctx, f.store, []byte("short")); err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Fatalf("opened with a 5-byte key: %v", err)
	}
}

// chunkFiles are the files of the stored chunks.
func (f *fixture) chunkFiles(t *testing.T) []string {
	files, err := filepath.Glob(filepath.Join(f.srv.Dir, "backups", "cluster-a", "chunks", "*", "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no chunk files: %v", err)
	}
	return files
}

// A damaged chunk stops the restore, which names it and the backup; Verify names every
// backup it breaks. A missing one is found before anything is written.
func TestDamagedOrMissingChunk(t *testing.T) {
	ctx := t.Context()
	f := newFixture(t)
	v := volume(t)
	for _, id := range []string{"monday", "tuesday"} {
		if _, err := f.repo.Backup(ctx, bytes.NewReader(v), volSize, backup.BackupOptions{ID: id, Volume: "ns/data"}); err != nil {
			t.Fatal(err)
		}
	}
	if rep, err := f.repo.Verify(ctx, 0); err != nil || len(rep.Bad) != 0 || rep.Backups != 2 {
		t.Fatalf("verify before any damage: %+v, %v", rep, err)
	}
	files := f.chunkFiles(t)
	damaged := filepath.Base(files[0])
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0x40
	if err := os.WriteFile(files[0], data, 0o644); err != nil {
		t.Fatal(err)
	}

	_, err = f.repo.Restore(ctx, "monday", discard{}, backup.RestoreOptions{})
	var ce *backup.ChunkError
	if !errors.As(err, &ce) || ce.Chunk != damaged || !strings.Contains(err.Error(), "monday") {
		t.Fatalf("restore with a damaged chunk: %v; want a ChunkError naming %s and the backup", err, damaged)
	}
	t.Logf("restore refused: %v", err)
	rep, err := f.repo.Verify(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Bad) != 1 || rep.Bad[0].Chunk != damaged || strings.Join(rep.Broken(), ",") != "monday,tuesday" {
		t.Fatalf("verify: %+v; want %s, breaking monday and tuesday", rep, damaged)
	}

	missing := filepath.Base(files[1])
	if err := os.Remove(files[1]); err != nil {
		t.Fatal(err)
	}
	var w countingWriter
	_, err = f.repo.Restore(ctx, "tuesday", &w, backup.RestoreOptions{})
	if !errors.As(err, &ce) || ce.Chunk != missing || !errors.Is(err, backup.ErrNotFound) || w.n.Load() != 0 {
		t.Fatalf("restore with a missing chunk: %v, %d writes; want it refused, naming %s, before writing", err, w.n.Load(), missing)
	}

	// The next backup of the volume uploads the missing chunk and the damaged one again:
	// the restore and verify that found it damaged recorded it. Then every backup reads.
	m, err := f.repo.Backup(ctx, bytes.NewReader(v), volSize, backup.BackupOptions{ID: "wednesday", Volume: "ns/data", Parent: "tuesday"})
	if err != nil {
		t.Fatal(err)
	}
	if m.Stats.Uploaded != 2 {
		t.Fatalf("a backup after a chunk went missing and another was found damaged uploaded %d chunks, want those 2", m.Stats.Uploaded)
	}
	if rep, err := f.repo.Verify(ctx, 0); err != nil || len(rep.Bad) != 0 {
		t.Fatalf("verify after the next backup: %+v, %v; want nothing bad", rep, err)
	}
	if got := f.restored(t, f.repo, "monday"); !bytes.Equal(got, v) {
		t.Fatal("monday does not restore once its damaged chunk was uploaded again")
	}
}

type discard struct{}

func (discard) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }

type countingWriter struct{ n atomic.Int64 }

func (w *countingWriter) WriteAt(p []byte, _ int64) (int, error) { w.n.Add(1); return len(p), nil }

// A backup stopped half way is not one (no manifest), and the same backup again uploads
// only what the first attempt did not.
func TestInterruptedBackupResumes(t *testing.T) {
	ctx := t.Context()
	f := newFixture(t)
	v := volume(t)
	cctx, cancel := context.WithCancel(ctx)
	src := &gate{r: bytes.NewReader(v), at: 20 << 20, reached: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := f.repo.Backup(cctx, src, volSize, backup.BackupOptions{ID: "nightly", Volume: "ns/data", Concurrency: 1})
		done <- err
	}()
	<-src.reached
	cancel()
	close(src.release)
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted backup: %v", err)
	}
	if _, err := f.repo.Manifest(ctx, "nightly"); !errors.Is(err, backup.ErrNotFound) {
		t.Fatalf("an interrupted backup has a manifest: %v", err)
	}
	if list, err := f.repo.Backups(ctx); err != nil || len(list) != 0 {
		t.Fatalf("backups after an interrupted one: %v, %v", list, err)
	}
	m, err := f.repo.Backup(ctx, bytes.NewReader(v), volSize, backup.BackupOptions{ID: "nightly", Volume: "ns/data"})
	if err != nil {
		t.Fatal(err)
	}
	if m.Stats.Reused == 0 || m.Stats.Uploaded+m.Stats.Reused+m.Stats.Zero != m.Stats.Chunks {
		t.Fatalf("resumed backup: %+v; want the chunks of the first attempt found, not uploaded", m.Stats)
	}
	if got := f.restored(t, f.repo, "nightly"); !bytes.Equal(got, v) {
		t.Fatal("the resumed backup does not restore the volume")
	}
}

// A backup runs (Running) from its start until its manifest is written or it stops, and
// one whose Commit refuses writes no manifest: what a caller that learns the backup is no
// longer wanted needs, so that nothing it deletes afterwards comes back.
func TestBackupRunsUntilCommitted(t *testing.T) {
	ctx := t.Context()
	f := newFixture(t)
	v := volume(t)
	src := &gate{r: bytes.NewReader(v), at: 0, reached: make(chan struct{}), release: make(chan struct{})}
	refused := errors.New("deleted meanwhile")
	done := make(chan error, 1)
	go func() {
		_, err := f.repo.Backup(ctx, src, volSize, backup.BackupOptions{ID: "unwanted", Volume: "ns/data",
			Commit: func(context.Context) error { return refused }})
		done <- err
	}()
	<-src.reached
	if running, err := f.repo.Running(ctx, "unwanted"); err != nil || !running {
		t.Fatalf("a backup reading its volume: running %v, %v", running, err)
	}
	if running, err := f.repo.Running(ctx, "other"); err != nil || running {
		t.Fatalf("a backup never started: running %v, %v", running, err)
	}
	close(src.release)
	if err := <-done; !errors.Is(err, refused) {
		t.Fatalf("a backup whose commit is refused: %v", err)
	}
	if _, err := f.repo.Manifest(ctx, "unwanted"); !errors.Is(err, backup.ErrNotFound) {
		t.Fatalf("a backup whose commit was refused has a manifest: %v", err)
	}
	if running, err := f.repo.Running(ctx, "unwanted"); err != nil || running {
		t.Fatalf("a backup that stopped: running %v, %v", running, err)
	}
}

// gate is a volume whose reads at or past at wait until release, after saying so once.
type gate struct {
	r       io.ReaderAt
	at      int64
	once    sync.Once
	reached chan struct{}
	release chan struct{}
}

func (g *gate) ReadAt(p []byte, off int64) (int, error) {
	if off >= g.at {
		g.once.Do(func() { close(g.reached) })
		<-g.release
	}
	return g.r.ReadAt(p, off)
}

// Prune deletes chunks no backup lists, an epoch after it condemned them, and never one that
// a backup running meanwhile reuses: a backup of the same data as a deleted one runs while a
// prune condemns that data's chunks; the next prune, which would delete them, finds it
// running with an older epoch and deletes nothing; the backup lists them all.
func TestPruneWhileABackupRuns(t *testing.T) {
	ctx := t.Context()
	f := newFixtureWith(t, backup.InitOptions{ChunkSize: chunk, PendingTimeout: 2 * time.Second})
	v := volume(t)
	if _, err := f.repo.Backup(ctx, bytes.NewReader(v), volSize, backup.BackupOptions{ID: "old", Volume: "ns/data"}); err != nil {
		t.Fatal(err)
	}
	if err := f.repo.Delete(ctx, "old"); err != nil {
		t.Fatal(err)
	}

	// A backup of the same data starts, finds the old chunks stored, and pauses.
	src := &gate{r: bytes.NewReader(v), at: 24 << 20, reached: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := f.repo.Backup(ctx, src, volSize, backup.BackupOptions{ID: "running", Volume: "ns/data", Concurrency: 1})
		done <- err
	}()
	<-src.reached

	res := f.pruneEpoch(t)
	if res.Deleted != 0 || res.Condemned == 0 {
		t.Fatalf("first prune: %+v; want chunks condemned, none deleted", res)
	}
	// The next prunes would delete them, but the backup read no epoch: they wait, making none.
	res = f.pruneWhen(t, "a prune that waits for the backup", func(res *backup.PruneResult) bool { return res.NotBefore.IsZero() })
	if res.Deleted != 0 || res.Epoch != 0 || strings.Join(res.Waiting, ",") != "running" {
		t.Fatalf("second prune while the backup runs: %+v; want it waiting for it", res)
	}
	close(src.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if res = f.pruneEpoch(t); res.Deleted != 0 || res.Condemned != 0 {
		t.Fatalf("prune after the backup: %+v; want nothing deleted (it lists every chunk)", res)
	}
	if got := f.restored(t, f.repo, "running"); !bytes.Equal(got, v) {
		t.Fatal("the backup that ran during the prune does not restore")
	}

	// With no backup left, two epochs empty the store of chunks.
	if err := f.repo.Delete(ctx, "running"); err != nil {
		t.Fatal(err)
	}
	f.pruneEpoch(t)
	if want := int((volSize - 8<<20) / chunk); f.pruneEpoch(t).Deleted != want {
		t.Fatalf("prune of a store with no backups did not delete its %d chunks", want)
	}
	if files, _ := filepath.Glob(filepath.Join(f.srv.Dir, "backups", "cluster-a", "chunks", "*", "*")); len(files) != 0 {
		t.Fatalf("%d chunk files left", len(files))
	}
}

// pruneEpoch prunes until a prune makes an epoch (one per pending timeout) and returns
// what that one did.
func (f *fixture) pruneEpoch(t *testing.T) *backup.PruneResult {
	t.Helper()
	return f.pruneWhen(t, "a prune that makes an epoch", func(res *backup.PruneResult) bool { return res.Epoch > 0 })
}

// pruneWhen prunes until what a prune did satisfies cond, and returns it.
func (f *fixture) pruneWhen(t *testing.T, what string, cond func(*backup.PruneResult) bool) *backup.PruneResult {
	t.Helper()
	var res *backup.PruneResult
	wait.Eventually(t, 30*time.Second, what, func(ctx context.Context) (bool, error) {
		var err error
		res, err = f.repo.Prune(ctx, backup.PruneOptions{})
		return err == nil && cond(res), err
	})
	return res
}
