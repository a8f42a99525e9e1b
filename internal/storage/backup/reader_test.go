package backup_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sync/errgroup"

	"github.com/crdipc/crdipc/internal/storage/backup"
)

// A Reader lists the data of a backup as extents (the zero chunks left out, neighbours
// merged) and reads it back at any offset, in pieces smaller than a chunk and across chunk
// ends, concurrently; a damaged chunk is an error naming it and the backup.
func TestReaderReadsABackupAtAnyOffset(t *testing.T) {
	ctx := t.Context()
	f := newFixture(t)
	// Not a whole number of chunks, with a hole of two chunks.
	v := randomBytes(t, 10*chunk+12345)
	clear(v[3*chunk : 5*chunk])
	if _, err := f.repo.Backup(ctx, bytes.NewReader(v), int64(len(v)), backup.BackupOptions{ID: "b1", Volume: "ns/data"}); err != nil {
		t.Fatal(err)
	}
	rd, err := f.repo.Reader(ctx, "b1")
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	want := []backup.Extent{{Offset: 0, Length: 3 * chunk}, {Offset: 5 * chunk, Length: int64(len(v)) - 5*chunk}}
	if got := rd.Extents(0, int64(len(v))); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("extents %v, want %v", got, want)
	}
	if got := rd.Extents(chunk+10, chunk); len(got) != 1 || got[0] != (backup.Extent{Offset: chunk + 10, Length: chunk}) {
		t.Errorf("extents of a range inside the data: %v", got)
	}

	got := make([]byte, len(v))
	const piece = 100 << 10 // pieces cross chunk ends
	var g errgroup.Group
	g.SetLimit(8)
	for off := 0; off < len(v); off += piece {
		g.Go(func() error { return rd.ReadAt(ctx, got[off:min(off+piece, len(v))], int64(off)) })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, v) {
		t.Fatal("the reader's bytes differ from the volume's")
	}
	if err := rd.ReadAt(ctx, make([]byte, 10), int64(len(v))-5); err == nil {
		t.Error("a read past the backup's end succeeded")
	}

	// A damaged chunk.
	files := f.chunkFiles(t)
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0x40
	if err := os.WriteFile(files[0], data, 0o644); err != nil {
		t.Fatal(err)
	}
	rd.Close()
	rd, err = f.repo.Reader(ctx, "b1")
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var ce *backup.ChunkError
	var failed error
	for off := int64(0); off < int64(len(v)) && failed == nil; off += chunk {
		failed = rd.ReadAt(ctx, make([]byte, min(chunk, int64(len(v))-off)), off)
	}
	if !errors.As(failed, &ce) || ce.Chunk != filepath.Base(files[0]) || !strings.Contains(failed.Error(), "b1") {
		t.Errorf("reading a damaged chunk: %v; want a ChunkError naming %s and the backup", failed, filepath.Base(files[0]))
	}

	// A missing chunk: refused before anything is read.
	if err := os.Remove(files[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := f.repo.Reader(ctx, "b1"); !errors.As(err, &ce) || ce.Chunk != filepath.Base(files[1]) {
		t.Errorf("a reader of a backup with a missing chunk: %v; want a ChunkError naming %s", err, filepath.Base(files[1]))
	}
}
