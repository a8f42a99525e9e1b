package backend_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/backend"
)

const gib = 1 << 30

func TestFilePoolLifecycle(t *testing.T) {
	ctx := context.Background()
	f := backend.NewFile(t.TempDir())
	p := backend.Pool{Name: "claim-node-1", Type: storagev1alpha1.PoolTypeStriped, Capacity: 10 * gib}

	if _, err := f.ImportPool(ctx, p); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("ImportPool before create: %v, want ErrNotFound", err)
	}
	st, err := f.CreatePool(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Location != f.PoolDir(p.Name) || st.Total != 10*gib || st.Used != 0 || st.Free <= 0 || st.Free > st.Total {
		t.Fatalf("state after create: %+v", st)
	}
	// Idempotent: creating again adopts.
	if _, err := f.CreatePool(ctx, p); err != nil {
		t.Fatalf("second CreatePool: %v", err)
	}
	if _, err := f.ImportPool(ctx, p); err != nil {
		t.Fatalf("ImportPool: %v", err)
	}

	r := backend.Replica{Namespace: "default", Name: "vol-claim-node-1", Capacity: gib}
	rs, err := f.CreateReplica(ctx, p, r)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(f.ReplicaPath(p.Name, r))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != gib || rs.Size != gib || rs.Allocated >= gib {
		t.Fatalf("replica: size %d, state %+v; want a sparse file of 1Gi", fi.Size(), rs)
	}
	if _, err := f.CreateReplica(ctx, p, r); err != nil {
		t.Fatalf("second CreateReplica: %v", err)
	}
	if st, _ := f.ImportPool(ctx, p); st.Used != gib || st.Free != 9*gib {
		t.Fatalf("pool after replica: %+v", st)
	}
	// A file larger than asked for is not this replica's (its capacity never shrinks); a
	// smaller one is grown, see TestFileGrowReplica.
	if _, err := f.CreateReplica(ctx, p, backend.Replica{Namespace: "default", Name: r.Name, Capacity: gib / 2}); err == nil {
		t.Fatal("CreateReplica with a smaller size adopted the larger existing file")
	}

	if err := f.DeleteReplica(ctx, p, r); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteReplica(ctx, p, r); err != nil {
		t.Fatalf("second DeleteReplica: %v", err)
	}
	if _, err := f.StatReplica(ctx, p, r); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("StatReplica after delete: %v", err)
	}
	if err := f.DeletePool(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := f.DeletePool(ctx, p); err != nil {
		t.Fatalf("second DeletePool: %v", err)
	}
	if _, err := os.Stat(f.PoolDir(p.Name)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("pool directory still there: %v", err)
	}
}

func TestFileReportsWhatDisappeared(t *testing.T) {
	ctx := context.Background()
	f := backend.NewFile(t.TempDir())
	p := backend.Pool{Name: "p", Capacity: gib}
	r := backend.Replica{Namespace: "ns", Name: "r", Capacity: 1 << 20}
	if _, err := f.CreatePool(ctx, p); err != nil {
		t.Fatal(err)
	}
	if _, err := f.CreateReplica(ctx, p, r); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(f.ReplicaPath(p.Name, r)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.StatReplica(ctx, p, r); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("StatReplica of a removed file: %v", err)
	}
	if err := os.Remove(filepath.Join(f.PoolDir(p.Name), ".crdipc-pool.json")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ImportPool(ctx, p); err == nil {
		t.Fatal("ImportPool of a pool without its marker succeeded")
	}
	if err := os.RemoveAll(f.PoolDir(p.Name)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ImportPool(ctx, p); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("ImportPool of a removed pool: %v", err)
	}
	if _, err := f.CreateReplica(ctx, p, r); err == nil {
		t.Fatal("CreateReplica in a removed pool succeeded (it must not re-create the pool)")
	}
}

func TestFileCreateReplicaCleansInterruptedCreate(t *testing.T) {
	ctx := context.Background()
	f := backend.NewFile(t.TempDir())
	p := backend.Pool{Name: "p", Capacity: gib}
	r := backend.Replica{Namespace: "ns", Name: "r", Capacity: 1 << 20}
	if _, err := f.CreatePool(ctx, p); err != nil {
		t.Fatal(err)
	}
	path := f.ReplicaPath(p.Name, r)
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	// What a create killed between open and rename leaves behind (safefile's temporary).
	dead := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp-dead")
	if err := os.WriteFile(dead, nil, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := f.CreateReplica(ctx, p, r); err != nil {
		t.Fatal(err)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".*.tmp-*"))
	if len(left) != 0 {
		t.Fatalf("temporaries left: %v", left)
	}
}

func TestFileHonoursCancelledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f := backend.NewFile(t.TempDir())
	if _, err := f.CreatePool(ctx, backend.Pool{Name: "p", Capacity: gib}); !errors.Is(err, context.Canceled) {
		t.Fatalf("CreatePool with a cancelled context: %v", err)
	}
}

// Names that would lead out of the pool directory are refused before any file is touched.
func TestFileRefusesNamesOutsideItsRoot(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	f := backend.NewFile(filepath.Join(root, "agent"))
	good := backend.Pool{Name: "p", Capacity: gib}
	if _, err := f.CreatePool(ctx, good); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"..", ".", "", "a/b", "../../x"} {
		if _, err := f.CreatePool(ctx, backend.Pool{Name: name, Capacity: gib}); err == nil {
			t.Errorf("CreatePool(%q) succeeded", name)
		}
		r := backend.Replica{Namespace: "ns", Name: name, Capacity: 1 << 20}
		if _, err := f.CreateReplica(ctx, good, r); err == nil {
			t.Errorf("CreateReplica(name %q) succeeded", name)
		}
		if _, err := f.ReplicaFile("p", backend.Replica{Namespace: name, Name: "r"}); err == nil {
			t.Errorf("ReplicaFile(namespace %q) succeeded", name)
		}
	}
	// Nothing was made beside the agent's root.
	if entries, _ := os.ReadDir(root); len(entries) != 1 {
		t.Errorf("%d entries beside the agent root, want none", len(entries)-1)
	}
	if _, err := f.CreateReplica(ctx, good, backend.Replica{Namespace: "ns-0", Name: "x0.r", Capacity: 1 << 20}); err != nil {
		t.Errorf("an ordinary name was refused: %v", err)
	}
}

func TestFileGrowReplica(t *testing.T) {
	ctx := context.Background()
	f := backend.NewFile(t.TempDir())
	p := backend.Pool{Name: "p", Capacity: 4 * gib}
	if _, err := f.CreatePool(ctx, p); err != nil {
		t.Fatal(err)
	}
	r := backend.Replica{Namespace: "ns", Name: "r", Capacity: 64 << 20}
	if _, err := f.GrowReplica(ctx, p, r); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("GrowReplica of a missing replica: %v, want ErrNotFound", err)
	}
	if _, err := f.CreateReplica(ctx, p, r); err != nil {
		t.Fatal(err)
	}
	path := f.ReplicaPath(p.Name, r)
	data := []byte("written before the growth")
	if err := os.WriteFile(path, data, 0); err != nil { // truncates: size it again below
		t.Fatal(err)
	}
	if err := os.Truncate(path, r.Capacity); err != nil {
		t.Fatal(err)
	}

	grown := r
	grown.Capacity = 3 * gib / 2
	for range 2 { // idempotent: the second call finds it grown
		st, err := f.GrowReplica(ctx, p, grown)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size != grown.Capacity || st.Allocated >= gib {
			t.Fatalf("after growth: %+v, want a sparse file of %d bytes", st, grown.Capacity)
		}
	}
	if !fileHas(t, path, data) {
		t.Fatal("data written before the growth is gone")
	}
	if ps, _ := f.ImportPool(ctx, p); ps.Used != grown.Capacity {
		t.Fatalf("pool used %d after growth, want %d", ps.Used, grown.Capacity)
	}
	// Never shrinks.
	if st, err := f.GrowReplica(ctx, p, r); err != nil || st.Size != grown.Capacity {
		t.Fatalf("GrowReplica to a smaller size: %+v, %v; want the grown size kept", st, err)
	}
	// The pool promised 4Gi: growing by more than it has left is refused, and nothing changes.
	tooBig := r
	tooBig.Capacity = 5 * gib
	if _, err := f.GrowReplica(ctx, p, tooBig); !errors.Is(err, backend.ErrNoSpace) {
		t.Fatalf("growth past the pool's capacity: %v, want ErrNoSpace", err)
	}
	if fi, _ := os.Stat(path); fi.Size() != grown.Capacity {
		t.Fatalf("refused growth changed the size to %d", fi.Size())
	}
	if _, err := f.GrowReplica(ctx, p, backend.Replica{Namespace: "ns", Name: "../r", Capacity: gib}); err == nil {
		t.Fatal("GrowReplica accepted a name outside the pool")
	}
}

// An agent killed between growing a replica and recording it created finds the file smaller
// than the grown spec: creating it again grows it.
func TestFileCreateReplicaGrowsAnAdoptedSmallerFile(t *testing.T) {
	ctx := context.Background()
	f := backend.NewFile(t.TempDir())
	p := backend.Pool{Name: "p", Capacity: gib}
	if _, err := f.CreatePool(ctx, p); err != nil {
		t.Fatal(err)
	}
	r := backend.Replica{Namespace: "ns", Name: "r", Capacity: 1 << 20}
	if _, err := f.CreateReplica(ctx, p, r); err != nil {
		t.Fatal(err)
	}
	r.Capacity = 8 << 20
	st, err := f.CreateReplica(ctx, p, r)
	if err != nil || st.Size != r.Capacity {
		t.Fatalf("CreateReplica over a smaller file: %+v, %v", st, err)
	}
}

func fileHas(t *testing.T, path string, prefix []byte) bool {
	t.Helper()
	got := make([]byte, len(prefix))
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	return string(got) == string(prefix)
}
