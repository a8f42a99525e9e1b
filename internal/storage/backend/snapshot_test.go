package backend_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/crdipc/crdipc/internal/storage/backend"
	"github.com/crdipc/crdipc/internal/storage/replica"
)

// A replica's snapshots (the files the replica data service keeps beside it) are deleted
// with it, with what an interrupted snapshot left; a neighbour whose name starts like a
// snapshot's keeps its files.
func TestFileDeleteReplicaRemovesItsSnapshots(t *testing.T) {
	ctx := context.Background()
	f := backend.NewFile(t.TempDir())
	p := backend.Pool{Name: "p", Capacity: gib}
	r := backend.Replica{Namespace: "ns", Name: "r", Capacity: 1 << 20}
	// A legal object name that makes the neighbour's files start with "r.img.snap.".
	neighbour := backend.Replica{Namespace: "ns", Name: "r.img.snap.s1", Capacity: 1 << 20}
	if _, err := f.CreatePool(ctx, p); err != nil {
		t.Fatal(err)
	}
	for _, x := range []backend.Replica{r, neighbour} {
		if _, err := f.CreateReplica(ctx, p, x); err != nil {
			t.Fatal(err)
		}
	}
	path, npath := f.ReplicaPath(p.Name, r), f.ReplicaPath(p.Name, neighbour)
	var files []string
	for _, name := range []string{"s1", "s2.daily"} {
		data, meta := replica.SnapshotFiles(path, name)
		files = append(files, data, meta)
	}
	// A copy whose metadata was never written, and a metadata write cut short.
	partial, partialMeta := replica.SnapshotFiles(path, "s3")
	files = append(files, partial, filepath.Join(filepath.Dir(partialMeta), "."+filepath.Base(partialMeta)+".tmp-dead"))
	others := []string{path + backend.MetaSuffix, npath, npath + backend.MetaSuffix}
	for _, file := range append(slices.Clone(files), others...) {
		if err := os.WriteFile(file, []byte("x"), 0o640); err != nil {
			t.Fatal(err)
		}
	}

	for range 2 {
		if err := f.DeleteReplica(ctx, p, r); err != nil {
			t.Fatal(err)
		}
	}
	for _, file := range append(files, path, path+backend.MetaSuffix) {
		if _, err := os.Lstat(file); !os.IsNotExist(err) {
			t.Errorf("%s survived the replica's deletion (%v)", filepath.Base(file), err)
		}
	}
	for _, file := range []string{npath, npath + backend.MetaSuffix} {
		if _, err := os.Lstat(file); err != nil {
			t.Errorf("the neighbour's %s went with the replica: %v", filepath.Base(file), err)
		}
	}
}
