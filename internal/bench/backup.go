package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/crdipc/crdipc/internal/storage/backup"
	"github.com/crdipc/crdipc/internal/storage/backup/s3local"
)

// BackupOptions size the backup bench.
type BackupOptions struct {
	// Dir holds the volume file, the restored file and the S3 server's buckets.
	Dir string
	// Size of the volume; ChunkSize of the store; Concurrency of uploads and downloads, the
	// same for the floor.
	Size        int64
	ChunkSize   int
	Concurrency int
	// ChangePercent of the volume, contiguous, is rewritten before the second backup.
	ChangePercent float64
	// Progress, if set, gets a line a second while a backup or restore runs.
	Progress io.Writer `json:"-"`
}

// DefaultBackupOptions are the issue's: 1 GiB in 4 MiB chunks, 1 % changed.
var DefaultBackupOptions = BackupOptions{Size: 1 << 30, ChunkSize: 4 << 20, Concurrency: 4, ChangePercent: 1}

// Backup is what the backup bench measured, against a local versitygw.
type Backup struct {
	Options BackupOptions `json:"options"`
	// PutMiBps and GetMiBps are the floor: the volume's chunks read from the file and put
	// as they are (then got back and written to a file), through the same S3 client.
	PutMiBps, GetMiBps float64
	// BackupMiBps and RestoreMiBps: the first, full backup and its restore.
	BackupMiBps, RestoreMiBps float64
	// Objects in the store after the first backup, per GiB of volume.
	Objects       int
	ObjectsPerGiB float64
	// IncrementalBytes were uploaded by the second backup, ChangePercent later;
	// IncrementalRatio is that over the volume's size.
	IncrementalBytes int64
	IncrementalRatio float64
	// Identical: the restore's bytes are the volume's.
	Identical bool
}

// MeasureBackup runs a versitygw under o.Dir, writes a volume file of random data (it
// does not compress: the worst case for the chunks' size), and measures the floor, a
// full backup, its restore, and a backup after o.ChangePercent changed.
func MeasureBackup(ctx context.Context, o BackupOptions) (*Backup, error) {
	if o.Size <= 0 || o.ChunkSize <= 0 || o.Concurrency <= 0 {
		return nil, fmt.Errorf("backup bench: size %d, chunk size %d and concurrency %d must be positive", o.Size, o.ChunkSize, o.Concurrency)
	}
	dir, err := os.MkdirTemp(o.Dir, "crdipc-bench-backup-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	srv, err := s3local.Start(ctx, filepath.Join(dir, "s3"))
	if err != nil {
		return nil, err
	}
	defer srv.Stop()
	store, err := backup.NewS3(ctx, backup.S3Options{Endpoint: srv.Endpoint, Bucket: "bench", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, Insecure: true, CreateBucket: true})
	if err != nil {
		return nil, err
	}
	vol, err := writeVolume(filepath.Join(dir, "volume"), o.Size)
	if err != nil {
		return nil, err
	}
	defer vol.Close()
	res := &Backup{Options: o}
	mib := float64(o.Size) / (1 << 20)

	// The floor: the same bytes, chunk by chunk, put and got as they are.
	start := time.Now()
	if err := floorPut(ctx, store, vol, o); err != nil {
		return nil, err
	}
	res.PutMiBps = mib / time.Since(start).Seconds()
	out, err := os.Create(filepath.Join(dir, "restored"))
	if err != nil {
		return nil, err
	}
	defer out.Close()
	start = time.Now()
	if err := floorGet(ctx, store, out, o); err != nil {
		return nil, err
	}
	res.GetMiBps = mib / time.Since(start).Seconds()
	if err := out.Truncate(0); err != nil {
		return nil, err
	}

	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	repo, err := backup.Open(ctx, store, key, backup.InitOptions{ChunkSize: o.ChunkSize})
	if err != nil {
		return nil, err
	}
	start = time.Now()
	if _, err := repo.Backup(ctx, vol, o.Size, backup.BackupOptions{ID: "full", Volume: "bench", Concurrency: o.Concurrency, Progress: progress(o.Progress, "backup")}); err != nil {
		return nil, err
	}
	res.BackupMiBps = mib / time.Since(start).Seconds()
	err = store.List(ctx, "", func(info backup.ObjectInfo) error {
		if filepath.Dir(info.Key) != "floor" {
			res.Objects++
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.ObjectsPerGiB = float64(res.Objects) / (float64(o.Size) / (1 << 30))

	start = time.Now()
	if _, err := repo.Restore(ctx, "full", out, backup.RestoreOptions{Concurrency: o.Concurrency, Progress: progress(o.Progress, "restore")}); err != nil {
		return nil, err
	}
	res.RestoreMiBps = mib / time.Since(start).Seconds()
	if res.Identical, err = sameFiles(vol, out, o.Size); err != nil {
		return nil, err
	}

	// ChangePercent, from a third of the way in.
	changed := make([]byte, int64(float64(o.Size)*o.ChangePercent/100))
	if _, err := rand.Read(changed); err != nil {
		return nil, err
	}
	if _, err := vol.WriteAt(changed, o.Size/3/int64(o.ChunkSize)*int64(o.ChunkSize)); err != nil {
		return nil, err
	}
	m, err := repo.Backup(ctx, vol, o.Size, backup.BackupOptions{ID: "incremental", Volume: "bench", Parent: "full", Concurrency: o.Concurrency})
	if err != nil {
		return nil, err
	}
	res.IncrementalBytes = m.Stats.UploadedBytes
	res.IncrementalRatio = float64(m.Stats.UploadedBytes) / float64(o.Size)
	return res, nil
}

// Goals are issue 40's: backup and restore at ≥ 0.7 of the store's own PUT and GET, a 1 %
// change uploading ≤ 2 %, ≤ 300 objects per GiB at 4 MiB chunks; and a restore that is
// the volume.
func (b *Backup) Goals() []Goal {
	identical := 0.0
	if b.Identical {
		identical = 1
	}
	return []Goal{
		ratioGoal("backup", "backup / the store's PUT (MiB/s)", b.BackupMiBps, b.PutMiBps, AtLeast, 0.7),
		ratioGoal("backup", "restore / the store's GET (MiB/s)", b.RestoreMiBps, b.GetMiBps, AtLeast, 0.7),
		absoluteGoal("backup", fmt.Sprintf("uploaded after %.3g %% changed / the volume", b.Options.ChangePercent), b.IncrementalRatio, AtMost, 0.02, Ratio),
		absoluteGoal("backup", fmt.Sprintf("objects per GiB (%d MiB chunks)", b.Options.ChunkSize>>20), b.ObjectsPerGiB, AtMost, 300, "objects"),
		absoluteGoal("backup", "restored bytes identical (1 = yes)", identical, AtLeast, 1, "bool"),
	}
}

// writeVolume fills a new file of size with random bytes (a fast generator: the bench is
// not about randomness) and returns it open.
func writeVolume(path string, size int64) (*os.File, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	seed := [32]byte{}
	if _, err := rand.Read(seed[:]); err != nil {
		f.Close()
		return nil, err
	}
	r := mrand.NewChaCha8(seed)
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		n := min(int64(len(buf)), size-off)
		_, _ = r.Read(buf[:n])
		if _, err := f.WriteAt(buf[:n], off); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}

func floorKey(i int64) string { return fmt.Sprintf("floor/%08d", i) }

func floorPut(ctx context.Context, s backup.Store, vol io.ReaderAt, o BackupOptions) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(o.Concurrency)
	for i := int64(0); i*int64(o.ChunkSize) < o.Size; i++ {
		g.Go(func() error {
			off := i * int64(o.ChunkSize)
			buf := make([]byte, min(int64(o.ChunkSize), o.Size-off))
			if _, err := vol.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			return s.Put(gctx, floorKey(i), buf)
		})
	}
	return g.Wait()
}

func floorGet(ctx context.Context, s backup.Store, dst io.WriterAt, o BackupOptions) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(o.Concurrency)
	for i := int64(0); i*int64(o.ChunkSize) < o.Size; i++ {
		g.Go(func() error {
			data, err := s.Get(gctx, floorKey(i))
			if err != nil {
				return err
			}
			_, err = dst.WriteAt(data, i*int64(o.ChunkSize))
			return err
		})
	}
	return g.Wait()
}

func sameFiles(a, b io.ReaderAt, size int64) (bool, error) {
	x, y := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(x)) {
		n := min(int64(len(x)), size-off)
		if _, err := a.ReadAt(x[:n], off); err != nil && !errors.Is(err, io.EOF) {
			return false, err
		}
		if _, err := b.ReadAt(y[:n], off); err != nil && !errors.Is(err, io.EOF) {
			return false, err
		}
		if !bytes.Equal(x[:n], y[:n]) {
			return false, nil
		}
	}
	return true, nil
}

// progress returns a Progress func that prints a line to w at most once a second (and the
// last), or nil without w. The repository never calls it concurrently.
func progress(w io.Writer, what string) func(backup.Progress) {
	if w == nil {
		return nil
	}
	var last time.Time
	return func(p backup.Progress) {
		if time.Since(last) < time.Second && p.Done < p.Total {
			return
		}
		last = time.Now()
		fmt.Fprintf(w, "%s: %d of %d MiB, %d objects (%d MiB) moved\n", what, p.Done>>20, p.Total>>20, p.Uploaded, p.UploadedBytes>>20)
	}
}
