package backend_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/backend"
)

// recorded plays back a conversation with zpool/zfs: each call must be the next expected
// command line, and gets its recorded output or error.
type recorded struct {
	t     *testing.T
	steps []step
}

type step struct {
	cmd    string
	out    string
	stderr string // non-empty: the command fails with this message
}

func (r *recorded) Run(_ context.Context, name string, args ...string) ([]byte, error) {
	r.t.Helper()
	cmd := name + " " + strings.Join(args, " ")
	if len(r.steps) == 0 {
		r.t.Fatalf("unexpected command %q", cmd)
	}
	s := r.steps[0]
	r.steps = r.steps[1:]
	if s.cmd != cmd {
		r.t.Fatalf("command %q, want %q", cmd, s.cmd)
	}
	if s.stderr != "" {
		return nil, fmt.Errorf("%s: exit status 1: %s", cmd, s.stderr)
	}
	return []byte(s.out), nil
}

func (r *recorded) done() {
	r.t.Helper()
	if len(r.steps) > 0 {
		r.t.Fatalf("commands not run: %v", r.steps)
	}
}

func TestZFSCreatePoolIsIdempotent(t *testing.T) {
	dir := t.TempDir()
	vd := filepath.Join(dir, "p1")
	rec := &recorded{t: t, steps: []step{
		{cmd: "zpool list -Hp -o health,size,allocated,free crdipc-p1", stderr: "cannot open 'crdipc-p1': no such pool"},
		{cmd: "zpool import -d " + vd + " crdipc-p1", stderr: "cannot import 'crdipc-p1': no such pool available"},
		{cmd: "zpool create -f -m none crdipc-p1 mirror " + vd + "/disk-0.img " + vd + "/disk-1.img"},
		{cmd: "zpool list -Hp -o health,size,allocated,free crdipc-p1", out: "ONLINE\t10737418240\t1024\t10737417216\n"},
		// Second create: the pool exists, nothing is created.
		{cmd: "zpool list -Hp -o health,size,allocated,free crdipc-p1", out: "ONLINE\t10737418240\t1024\t10737417216\n"},
	}}
	z := &backend.ZFS{Runner: rec, VdevDir: dir}
	p := backend.Pool{Name: "p1", Type: storagev1alpha1.PoolTypeMirrored, Capacity: 10 * gib}
	for range 2 {
		st, err := z.CreatePool(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Location != "crdipc-p1" || st.Total != 10*gib || st.Used != 1024 || st.Degraded {
			t.Fatalf("state %+v", st)
		}
	}
	rec.done()
	for _, f := range []string{"disk-0.img", "disk-1.img"} {
		fi, err := os.Stat(filepath.Join(vd, f))
		if err != nil || fi.Size() != 10*gib {
			t.Fatalf("vdev %s: %v %v", f, fi, err)
		}
	}
}

func TestZFSImportNeverCreates(t *testing.T) {
	dir := t.TempDir()
	rec := &recorded{t: t, steps: []step{
		{cmd: "zpool list -Hp -o health,size,allocated,free crdipc-p1", stderr: "cannot open 'crdipc-p1': no such pool"},
		{cmd: "zpool import -d " + filepath.Join(dir, "p1") + " crdipc-p1", stderr: "cannot import 'crdipc-p1': no such pool available"},
		// After a reboot: not imported yet, import finds it; DEGRADED is reported.
		{cmd: "zpool list -Hp -o health,size,allocated,free crdipc-p1", stderr: "cannot open 'crdipc-p1': no such pool"},
		{cmd: "zpool import -d " + filepath.Join(dir, "p1") + " crdipc-p1"},
		{cmd: "zpool list -Hp -o health,size,allocated,free crdipc-p1", out: "DEGRADED\t100\t10\t90\n"},
		{cmd: "zpool list -Hp -o health,size,allocated,free crdipc-p1", out: "FAULTED\t100\t10\t90\n"},
	}}
	z := &backend.ZFS{Runner: rec, VdevDir: dir}
	p := backend.Pool{Name: "p1", Capacity: 100}
	if _, err := z.ImportPool(context.Background(), p); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("import of a missing pool: %v", err)
	}
	st, err := z.ImportPool(context.Background(), p)
	if err != nil || !st.Degraded {
		t.Fatalf("import: %+v %v", st, err)
	}
	if _, err := z.ImportPool(context.Background(), p); err == nil || !strings.Contains(err.Error(), "FAULTED") {
		t.Fatalf("faulted pool: %v", err)
	}
	rec.done()
}

func TestZFSReplicas(t *testing.T) {
	rec := &recorded{t: t, steps: []step{
		{cmd: "zfs list -Hp -o volsize,used crdipc-p1/default/vol-p1", stderr: "cannot open 'crdipc-p1/default/vol-p1': dataset does not exist"},
		{cmd: "zfs create -p -s -V 1000013824 crdipc-p1/default/vol-p1"},
		{cmd: "zfs list -Hp -o volsize,used crdipc-p1/default/vol-p1", out: "1000013824\t8192\n"},
		{cmd: "zfs list -Hp -o volsize,used crdipc-p1/default/vol-p1", out: "1000013824\t8192\n"},
		{cmd: "zfs destroy crdipc-p1/default/vol-p1"},
		{cmd: "zfs destroy crdipc-p1/default/vol-p1", stderr: "cannot open 'crdipc-p1/default/vol-p1': dataset does not exist"},
		{cmd: "zpool destroy -f crdipc-p1", stderr: "cannot open 'crdipc-p1': no such pool"},
	}}
	z := &backend.ZFS{Runner: rec, VdevDir: t.TempDir()}
	ctx := context.Background()
	p := backend.Pool{Name: "p1", Capacity: 10 * gib}
	r := backend.Replica{Namespace: "default", Name: "vol-p1", Capacity: 1e9} // rounded up to 16 KiB
	st, err := z.CreateReplica(ctx, p, r)
	if err != nil || st.Size != 1000013824 || st.Location != "/dev/zvol/crdipc-p1/default/vol-p1" {
		t.Fatalf("create: %+v %v", st, err)
	}
	if _, err := z.CreateReplica(ctx, p, r); err != nil { // adopts
		t.Fatal(err)
	}
	for range 2 {
		if err := z.DeleteReplica(ctx, p, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := z.DeletePool(ctx, p); err != nil {
		t.Fatal(err)
	}
	rec.done()
}

func TestZFSGrowReplica(t *testing.T) {
	const ds = "crdipc-p1/default/vol-p1"
	rec := &recorded{t: t, steps: []step{
		{cmd: "zfs list -Hp -o volsize,used " + ds, out: "1000013824\t8192\n"},
		{cmd: "zfs set volsize=2000011264 " + ds}, // 2e9 rounded up to 16 KiB
		{cmd: "zfs list -Hp -o volsize,used " + ds, out: "2000011264\t8192\n"},
		// Again: already that large, nothing is set; nor for a smaller size.
		{cmd: "zfs list -Hp -o volsize,used " + ds, out: "2000011264\t8192\n"},
		{cmd: "zfs list -Hp -o volsize,used " + ds, out: "2000011264\t8192\n"},
		// No room: the error says so.
		{cmd: "zfs list -Hp -o volsize,used " + ds, out: "2000011264\t8192\n"},
		{cmd: "zfs set volsize=1099511627776 " + ds, stderr: "cannot set property for '" + ds + "': out of space"},
		{cmd: "zfs list -Hp -o volsize,used " + ds, stderr: "cannot open '" + ds + "': dataset does not exist"},
		// CreateReplica of an existing smaller zvol grows it.
		{cmd: "zfs list -Hp -o volsize,used " + ds, out: "2000011264\t8192\n"},
		{cmd: "zfs set volsize=3000008704 " + ds},
		{cmd: "zfs list -Hp -o volsize,used " + ds, out: "3000008704\t8192\n"},
	}}
	z := &backend.ZFS{Runner: rec, VdevDir: t.TempDir()}
	ctx := context.Background()
	p := backend.Pool{Name: "p1", Capacity: 10 * gib}
	r := backend.Replica{Namespace: "default", Name: "vol-p1", Capacity: 2e9}
	for range 2 {
		st, err := z.GrowReplica(ctx, p, r)
		if err != nil || st.Size != 2000011264 {
			t.Fatalf("grow: %+v %v", st, err)
		}
	}
	if st, err := z.GrowReplica(ctx, p, backend.Replica{Namespace: "default", Name: "vol-p1", Capacity: 1e9}); err != nil || st.Size != 2000011264 {
		t.Fatalf("grow to a smaller size: %+v %v", st, err)
	}
	if _, err := z.GrowReplica(ctx, p, backend.Replica{Namespace: "default", Name: "vol-p1", Capacity: 1 << 40}); !errors.Is(err, backend.ErrNoSpace) {
		t.Fatalf("grow without room: %v, want ErrNoSpace", err)
	}
	if _, err := z.GrowReplica(ctx, p, r); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("grow of a missing zvol: %v, want ErrNotFound", err)
	}
	if st, err := z.CreateReplica(ctx, p, backend.Replica{Namespace: "default", Name: "vol-p1", Capacity: 3e9}); err != nil || st.Size != 3000008704 {
		t.Fatalf("create over a smaller zvol: %+v %v", st, err)
	}
	rec.done()
}
