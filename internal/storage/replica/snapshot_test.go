package replica

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/testenv/require"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// reflinkDir mounts a small XFS (which shares blocks between files: FICLONE) from a sparse
// image on a loop device and returns a directory on it. It needs mkfs.xfs (xfsprogs) and
// mount privilege: skipped without them, failed when CRDIPC_REQUIRE_MOUNT=1 (as in CI).
func reflinkDir(t *testing.T) string {
	t.Helper()
	unavailable := func(format string, args ...any) {
		t.Helper()
		require.Capable(t, "CRDIPC_REQUIRE_MOUNT", fmt.Errorf("no reflink file system: "+format, args...))
	}
	mkfs := require.Tool(t, "CRDIPC_REQUIRE_MOUNT", "mkfs.xfs")
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "xfs.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o750); err != nil {
		t.Fatal(err)
	}
	// XFS wants 300 MiB at least; the image is sparse, so it costs what is written.
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 320<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(mkfs, "-q", "-m", "reflink=1", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.xfs: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		unavailable("mounting an XFS image: %v: %s", err, out)
	}
	t.Cleanup(func() {
		// The loop device goes with the mount (-o loop sets autoclear).
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmounting %s: %v", mnt, err)
		}
	})
	return mnt
}

// snapMode is how a test's node copies snapshots.
type snapMode struct {
	name    string
	reflink bool // FICLONE expected to be used
	setup   func(t *testing.T, n *testNode)
}

var snapModes = []snapMode{
	{name: "sparse", setup: func(t *testing.T, n *testNode) {
		n.tweak = func(s *Server) { s.testNoReflink = true }
	}},
	{name: "reflink", reflink: true, setup: func(t *testing.T, n *testNode) {
		n.dir = reflinkDir(t)
	}},
}

// image is a replica's expected content, written through the replica and kept in memory.
type image struct {
	t   *testing.T
	r   *Client
	b   []byte
	rev uint64
}

func (im *image) write(ctx context.Context, off int64, n int, seed uint64) {
	im.t.Helper()
	p := make([]byte, n)
	pattern(p, seed)
	im.rev++
	if err := im.r.WriteAt(ctx, p, off, im.rev); err != nil {
		im.t.Fatal(err)
	}
	copy(im.b[off:], p)
}

func shaOf(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// readAll reads a whole replica (or snapshot) through the data service.
func readAll(t testing.TB, ctx context.Context, r *Client, size int64) []byte {
	t.Helper()
	b := make([]byte, size)
	if err := r.ReadAt(ctx, b, 0); err != nil {
		t.Fatalf("reading %s: %v", r.ID(), err)
	}
	return b
}

// A snapshot keeps the bytes as of the call while the replica goes on changing; it is as
// sparse as the data; taking it again reports the same snapshot; it is a read-only replica
// under "<id>@<name>"; only the writer session may take one; deleting is idempotent.
func TestSnapshotHoldsDataAsOfTheCall(t *testing.T) {
	for _, mode := range snapModes {
		t.Run(mode.name, func(t *testing.T) {
			const size = 16 << 20
			pki := newTestPKI(t)
			n := newTestNode(t, pki, "node-a")
			mode.setup(t, n)
			n.create("ns/r1", size)
			n.start()
			ctx := ctxT(t)
			conn := n.dial(t)
			r := conn.Replica("ns/r1")
			if _, err := r.Open(ctx); err != nil {
				t.Fatal(err)
			}
			im := &image{t: t, r: r, b: make([]byte, size)}
			// Data in a few places, holes between and after.
			im.write(ctx, 0, 1<<20, 1)
			im.write(ctx, 5<<20, 256<<10, 2)
			im.write(ctx, 9<<20+4096, 64<<10, 3)
			want, wantRev := bytes.Clone(im.b), im.rev
			dataExts, err := r.Extents(ctx, 0, size)
			if err != nil {
				t.Fatal(err)
			}
			dataAlloc := blocks(t, n.path("ns/r1"))

			si, err := r.Snapshot(ctx, "s1")
			if err != nil {
				t.Fatal(err)
			}
			if !si.Created || si.ID != "ns/r1@s1" || si.Name != "s1" || si.Size != size || si.Revision != wantRev || si.Time.IsZero() {
				t.Fatalf("snapshot info %+v", si)
			}
			if si.Reflink != mode.reflink {
				t.Fatalf("snapshot reflink=%v, want %v in the %s mode", si.Reflink, mode.reflink, mode.name)
			}
			t.Logf("%s: data allocates %d bytes, snapshot %d", mode.name, dataAlloc, si.Allocated)

			// Later writes change the replica, not the snapshot.
			im.write(ctx, 0, 4096, 4)
			im.write(ctx, 5<<20+128<<10, 4096, 5)
			im.write(ctx, 12<<20, 1<<20, 6)
			if err := r.Flush(ctx); err != nil {
				t.Fatal(err)
			}

			dataFile, metaFile := SnapshotFiles(n.path("ns/r1"), "s1")
			if got := fileSHA(t, dataFile); got != shaOf(want) {
				t.Fatalf("snapshot file sha256 %s, want %s (the data as of the call)", got, shaOf(want))
			}
			if _, err := os.Stat(metaFile); err != nil {
				t.Fatalf("snapshot metadata: %v", err)
			}
			if !bytes.Equal(readAll(t, ctx, r, size), im.b) {
				t.Fatal("the replica does not hold the writes made after the snapshot")
			}
			// Sparse: the copy allocates about what the data did (file systems may round
			// extents up), not the replica's size.
			if snapAlloc := blocks(t, dataFile); snapAlloc < dataAlloc-64<<10 || snapAlloc > dataAlloc+1<<20 {
				t.Fatalf("snapshot allocates %d bytes, the data %d: not a sparse copy", snapAlloc, dataAlloc)
			}

			// The snapshot as a read-only replica.
			snap := conn.Replica(SnapshotID("ns/r1", "s1"))
			in, err := snap.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if in.Size != size || in.Revision != wantRev || in.Dirty || in.Rebuilding || in.Session {
				t.Fatalf("snapshot replica info %+v", in)
			}
			if !bytes.Equal(readAll(t, ctx, snap, size), want) {
				t.Fatal("the snapshot reads other bytes than the data as of the call")
			}
			if exts, err := snap.Extents(ctx, 0, size); err != nil || !reflect.DeepEqual(exts, dataExts) {
				t.Fatalf("snapshot extents %v (%v), data's at the call %v", fmtExtents(exts), err, fmtExtents(dataExts))
			}
			p := make([]byte, 4096)
			mustBe(t, snap.WriteAt(ctx, p, 0, 99), ErrInvalid)
			_, err = snap.Open(ctx)
			mustBe(t, err, ErrInvalid)
			mustBe(t, snap.Flush(ctx), ErrInvalid)
			mustBe(t, snap.CloseSession(ctx), ErrInvalid)
			mustBe(t, snap.Rebuild(ctx, n.addr, "ns/r1"), ErrInvalid)
			_, err = snap.Snapshot(ctx, "s2")
			mustBe(t, err, ErrInvalid)

			// Again: the same snapshot, untouched by the writes since.
			again, err := r.Snapshot(ctx, "s1")
			if err != nil {
				t.Fatal(err)
			}
			if again.Created || again.Revision != si.Revision || !again.Time.Equal(si.Time) || again.Size != si.Size {
				t.Fatalf("repeated snapshot %+v, first %+v", again, si)
			}
			if got := fileSHA(t, dataFile); got != shaOf(want) {
				t.Fatal("repeating the snapshot changed it")
			}

			// Names are checked by the server too, not only by the client.
			for _, bad := range []string{"", "Upper", "-lead", "a/b", "a@b", "../x", string(make([]byte, 129))} {
				_, err := r.simple(ctx, opSnapshot, 0, 0, []byte(bad))
				mustBe(t, err, ErrInvalid)
				_, err = r.simple(ctx, opDeleteSnapshot, 0, 0, []byte(bad))
				mustBe(t, err, ErrInvalid)
			}

			// Only the writer session takes snapshots; anybody deletes them.
			other := n.dial(t).Replica("ns/r1")
			_, err = other.Snapshot(ctx, "s3")
			mustBe(t, err, ErrBusy)
			if err := r.CloseSession(ctx); err != nil {
				t.Fatal(err)
			}
			_, err = r.Snapshot(ctx, "s3")
			mustBe(t, err, ErrNoSession)
			for _, f := range snapshotFilesOf(t, n.path("ns/r1")) {
				if f != dataFile && f != metaFile {
					t.Fatalf("refused snapshots left a file: %s", f)
				}
			}
			for range 2 {
				if err := other.DeleteSnapshot(ctx, "s1"); err != nil {
					t.Fatalf("DeleteSnapshot: %v", err)
				}
			}
			if left := snapshotFilesOf(t, n.path("ns/r1")); len(left) != 0 {
				t.Fatalf("files left after DeleteSnapshot: %v", left)
			}
			_, err = n.dial(t).Replica(SnapshotID("ns/r1", "s1")).Info(ctx)
			mustBe(t, err, ErrNotFound)
			if err := other.DeleteSnapshot(ctx, "never-taken"); err != nil {
				t.Fatalf("DeleteSnapshot of a snapshot that never existed: %v", err)
			}
		})
	}
}

// snapshotFilesOf lists the snapshot files of the replica whose data file is data.
func snapshotFilesOf(t testing.TB, data string) []string {
	t.Helper()
	m, err := filepath.Glob(data + ".snap.*")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A snapshot whose metadata is missing (the copy was cut short, or the metadata never
// written) does not exist: taking it again makes a new, complete one of the data as it
// is now.
func TestPartialSnapshotIsRedone(t *testing.T) {
	const size = 4 << 20
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.create("ns/r1", size)
	n.start()
	ctx := ctxT(t)
	conn := n.dial(t)
	r := conn.Replica("ns/r1")
	if _, err := r.Open(ctx); err != nil {
		t.Fatal(err)
	}
	im := &image{t: t, r: r, b: make([]byte, size)}
	im.write(ctx, 0, 512<<10, 1)
	dataFile, metaFile := SnapshotFiles(n.path("ns/r1"), "s1")

	// A crash during the copy: garbage under the data name, no metadata.
	garbage := make([]byte, size)
	pattern(garbage, 77)
	if err := os.WriteFile(dataFile, garbage, 0o640); err != nil {
		t.Fatal(err)
	}
	_, err := conn.Replica(SnapshotID("ns/r1", "s1")).Info(ctx)
	mustBe(t, err, ErrNotFound)
	si, err := r.Snapshot(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if !si.Created || si.Revision != im.rev {
		t.Fatalf("snapshot over a partial one: %+v", si)
	}
	if got := fileSHA(t, dataFile); got != shaOf(im.b) {
		t.Fatal("the partial snapshot's bytes survived")
	}

	// A crash before the metadata was written, after the data moved on: redone as of now.
	im.write(ctx, 1<<20, 4096, 2)
	if err := os.Remove(metaFile); err != nil {
		t.Fatal(err)
	}
	si2, err := r.Snapshot(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	if !si2.Created || si2.Revision != im.rev {
		t.Fatalf("snapshot without metadata was not taken again: %+v", si2)
	}
	if got := fileSHA(t, dataFile); got != shaOf(im.b) {
		t.Fatal("the redone snapshot does not hold the data as of the second call")
	}
	if err := r.CloseSession(ctx); err != nil {
		t.Fatal(err)
	}
}

// Writes racing a snapshot: the snapshot holds every write acknowledged before the call,
// none applied after it (each block's sequence number is at most the snapshot's
// revision), and no block half written.
func TestSnapshotUnderConcurrentWrites(t *testing.T) {
	const size, blk, writers = 8 << 20, 4096, 4
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.create("ns/r1", size)
	n.start()
	ctx := ctxT(t)
	conn := n.dial(t)
	r := conn.Replica("ns/r1")
	if _, err := r.Open(ctx); err != nil {
		t.Fatal(err)
	}
	var seq atomic.Uint64
	nblocks := size / blk
	acked := make([]atomic.Uint64, nblocks) // newest acknowledged sequence number per block
	var wrote atomic.Int64
	stop := make(chan struct{})
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for g := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, blk)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				b := (i*writers + g) % nblocks // each block belongs to one writer
				v := seq.Add(1)
				fillBlock(buf, uint64(b), v)
				if err := r.WriteAt(ctx, buf, int64(b)*blk, v); err != nil {
					errs <- err
					return
				}
				acked[b].Store(v)
				wrote.Add(1)
			}
		}()
	}
	waitWrites := func(n int64) {
		t.Helper()
		wait.Eventually(t, 30*time.Second, fmt.Sprintf("%d writes", n), func(context.Context) (bool, error) {
			select {
			case err := <-errs:
				t.Fatal(err)
			default:
			}
			if got := wrote.Load(); got < n {
				return false, fmt.Errorf("%d written", got)
			}
			return true, nil
		})
	}
	waitWrites(500)
	before := make([]uint64, nblocks)
	for i := range before {
		before[i] = acked[i].Load()
	}
	si, err := r.Snapshot(ctx, "s1")
	if err != nil {
		t.Fatal(err)
	}
	after := wrote.Load()
	waitWrites(after + 500) // writes resume
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}

	dataFile, _ := SnapshotFiles(n.path("ns/r1"), "s1")
	snap, err := os.ReadFile(dataFile)
	if err != nil {
		t.Fatal(err)
	}
	for b := range nblocks {
		got, ok := checkBlock(snap[b*blk:(b+1)*blk], uint64(b))
		if !ok {
			t.Fatalf("block %d of the snapshot is torn or foreign", b)
		}
		if got < before[b] {
			t.Fatalf("block %d: snapshot holds write %d, but %d was acknowledged before the call", b, got, before[b])
		}
		if got > si.Revision {
			t.Fatalf("block %d: snapshot holds write %d, above its revision %d", b, got, si.Revision)
		}
	}
	if err := r.CloseSession(ctx); err != nil {
		t.Fatal(err)
	}
}

// fillBlock writes block number b and sequence number v, then a pattern derived from both.
func fillBlock(buf []byte, b, v uint64) {
	binary.BigEndian.PutUint64(buf[0:], b)
	binary.BigEndian.PutUint64(buf[8:], v)
	pattern(buf[16:], b<<32^v)
}

// checkBlock returns the sequence number in a block filled by fillBlock for block b (0 for
// a block never written); ok is false for one that is torn or belongs elsewhere.
func checkBlock(buf []byte, b uint64) (uint64, bool) {
	if bytes.Equal(buf, make([]byte, len(buf))) {
		return 0, true
	}
	v := binary.BigEndian.Uint64(buf[8:])
	want := make([]byte, len(buf))
	fillBlock(want, b, v)
	return v, bytes.Equal(buf, want)
}

// A replica on another server rebuilt from "<id>@<snapshot>" holds exactly the snapshot's
// bytes, its holes staying holes, although the snapshot's replica changed since; a larger
// replica (a restore at a larger size) gets the snapshot followed by a hole.
func TestRebuildFromSnapshot(t *testing.T) {
	for _, mode := range snapModes {
		t.Run(mode.name, func(t *testing.T) {
			const size = 16 << 20
			pki := newTestPKI(t)
			a, b := newTestNode(t, pki, "node-a"), newTestNode(t, pki, "node-b")
			mode.setup(t, a)
			a.create("ns/src", size)
			b.create("ns/dst", size)
			b.create("ns/big", 2*size)
			// Stale garbage on the replica to fill, partly where the snapshot has holes.
			fillFile(t, b.path("ns/dst"), 50, Extent{0, 2 << 20}, Extent{10 << 20, 4 << 20})
			a.start()
			b.start()
			ctx := ctxT(t)
			src := a.dial(t).Replica("ns/src")
			if _, err := src.Open(ctx); err != nil {
				t.Fatal(err)
			}
			im := &image{t: t, r: src, b: make([]byte, size)}
			im.write(ctx, 1<<20, 1<<20, 1)
			im.write(ctx, 6<<20, 128<<10, 2)
			im.write(ctx, 15<<20, 4096, 3)
			si, err := src.Snapshot(ctx, "snap-1")
			if err != nil {
				t.Fatal(err)
			}
			want := bytes.Clone(im.b)
			snapExts, err := a.dial(t).Replica(si.ID).Extents(ctx, 0, size)
			if err != nil {
				t.Fatal(err)
			}
			// The replica moves on; the snapshot does not.
			im.write(ctx, 1<<20, 4096, 4)
			im.write(ctx, 11<<20, 1<<20, 5)

			bconn := b.dial(t)
			for _, id := range []string{"ns/dst", "ns/big"} {
				dst := bconn.Replica(id)
				if _, err := dst.Open(ctx); err != nil {
					t.Fatal(err)
				}
				if err := dst.Rebuild(ctx, a.addr, si.ID); err != nil {
					t.Fatal(err)
				}
				in := waitRebuilt(t, ctx, dst)
				if in.Revision != si.Revision {
					t.Fatalf("%s: revision %d after the rebuild, snapshot's %d", id, in.Revision, si.Revision)
				}
				exts, err := dst.Extents(ctx, 0, in.Size)
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(exts, snapExts) {
					t.Fatalf("%s: holes not kept:\nsnapshot %v\nrebuilt  %v", id, fmtExtents(snapExts), fmtExtents(exts))
				}
				if err := dst.CloseSession(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if got := fileSHA(t, b.path("ns/dst")); got != shaOf(want) {
				t.Fatalf("rebuilt replica sha256 %s, snapshot's %s", got, shaOf(want))
			}
			bigWant := append(bytes.Clone(want), make([]byte, size)...)
			if got := fileSHA(t, b.path("ns/big")); got != shaOf(bigWant) {
				t.Fatal("the larger replica does not hold the snapshot followed by zeros")
			}

			// A snapshot larger than the replica cannot fill it.
			b.create("ns/small", size/2)
			small := bconn.Replica("ns/small")
			if err := small.Rebuild(ctx, a.addr, si.ID); err != nil {
				t.Fatal(err)
			}
			if in := waitRebuildError(t, ctx, small); in.RebuildError == "" {
				t.Fatalf("rebuild of a smaller replica from a snapshot: %+v", in)
			}
			if err := src.CloseSession(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A snapshot deleted and taken again under the same name is what new readers see, while a
// reader that opened the old one keeps it.
func TestSnapshotRetakenAfterDelete(t *testing.T) {
	const size = 1 << 20
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.create("ns/r1", size)
	n.start()
	ctx := ctxT(t)
	r := n.dial(t).Replica("ns/r1")
	if _, err := r.Open(ctx); err != nil {
		t.Fatal(err)
	}
	im := &image{t: t, r: r, b: make([]byte, size)}
	im.write(ctx, 0, 64<<10, 1)
	first := bytes.Clone(im.b)
	if _, err := r.Snapshot(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	oldReader := n.dial(t).Replica(SnapshotID("ns/r1", "s"))
	if !bytes.Equal(readAll(t, ctx, oldReader, size), first) {
		t.Fatal("first snapshot")
	}
	if err := r.DeleteSnapshot(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	im.write(ctx, 0, 64<<10, 2)
	if _, err := r.Snapshot(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, ctx, oldReader, size), first) {
		t.Fatal("a reader of the deleted snapshot lost it")
	}
	if !bytes.Equal(readAll(t, ctx, n.dial(t).Replica(SnapshotID("ns/r1", "s")), size), im.b) {
		t.Fatal("a new reader sees the deleted snapshot instead of the new one")
	}
	if err := r.CloseSession(ctx); err != nil {
		t.Fatal(err)
	}
}

// The file system fills during the copy: ErrNoSpace, no snapshot left behind, and the
// replica goes on taking writes.
func TestSnapshotOnAFullFileSystem(t *testing.T) {
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	smallFS(t, n.dir, "4m")
	n.create("ns/r1", 8<<20)
	n.tweak = func(s *Server) { s.testNoReflink = true }
	n.start()
	ctx := ctxT(t)
	r := n.dial(t).Replica("ns/r1")
	if _, err := r.Open(ctx); err != nil {
		t.Fatal(err)
	}
	im := &image{t: t, r: r, b: make([]byte, 8<<20)}
	im.write(ctx, 0, 3<<20, 1) // the copy of 3 MiB does not fit beside it
	_, err := r.Snapshot(ctx, "s1")
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("snapshot on a full file system: %v, want ErrNoSpace", err)
	}
	if left := snapshotFilesOf(t, n.path("ns/r1")); len(left) != 0 {
		t.Fatalf("a failed snapshot left %v", left)
	}
	im.write(ctx, 4<<20, 4096, 2)
	if err := r.CloseSession(ctx); err != nil {
		t.Fatal(err)
	}
}

// SnapshotNames finds the snapshots beside a data file by their metadata file, and nothing
// else: not the replica's own files, not another replica's snapshots, not a snapshot whose
// metadata was never written.
func TestSnapshotNames(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "r1.img")
	var files []string
	for _, name := range []string{"a", "b-2"} {
		d, m := SnapshotFiles(data, name)
		files = append(files, d, m)
	}
	partial, _ := SnapshotFiles(data, "partial")
	other, otherMeta := SnapshotFiles(filepath.Join(dir, "r10.img"), "c")
	files = append(files, data, data+".meta", partial, other, otherMeta)
	for _, f := range files {
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := SnapshotNames(data)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if !reflect.DeepEqual(got, []string{"a", "b-2"}) {
		t.Errorf("SnapshotNames = %v, want [a b-2]", got)
	}
}
