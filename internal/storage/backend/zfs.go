package backend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// Runner runs a command line and returns its standard output. An error for a command that
// ran and failed carries its standard error text, which ZFS classifies (e.g. "no such pool").
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
}

// ExecRunner runs commands with os/exec.
type ExecRunner struct{}

// Run implements Runner.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// ZFSAvailable reports whether the zpool and zfs commands are installed.
func ZFSAvailable() bool {
	_, err1 := exec.LookPath("zpool")
	_, err2 := exec.LookPath("zfs")
	return err1 == nil && err2 == nil
}

// ZFS keeps each pool as a zpool named crdipc-<pool> on sparse file vdevs under VdevDir
// (as many as the pool type needs), and each replica as a sparse zvol
// crdipc-<pool>/<namespace>/<replica>.
//
// It has only been tested against recorded command lines, not against a real ZFS.
type ZFS struct {
	Runner  Runner
	VdevDir string
}

// NewZFS returns a ZFS backend that runs the real commands.
func NewZFS(vdevDir string) *ZFS { return &ZFS{Runner: ExecRunner{}, VdevDir: vdevDir} }

// zpoolPrefix makes every zpool name start with a letter and avoids ZFS's reserved
// names (mirror, raidz, log, c0…).
const zpoolPrefix = "crdipc-"

// volBlockSize: a zvol's size must be a multiple of its block size.
const volBlockSize = 16 << 10

func (z *ZFS) zpool(p Pool) string { return zpoolPrefix + p.Name }

func (z *ZFS) dataset(p Pool, r Replica) string {
	return z.zpool(p) + "/" + r.Namespace + "/" + r.Name
}

// vdevs returns the zpool layout keyword ("" for a stripe) and the vdev files the pool
// type needs.
func (z *ZFS) vdevs(p Pool) (string, []string) {
	n, layout := 1, ""
	switch p.Type {
	case storagev1alpha1.PoolTypeMirrored:
		n, layout = 2, "mirror"
	case storagev1alpha1.PoolTypeRaidz:
		n, layout = 3, "raidz"
	case storagev1alpha1.PoolTypeRaidz2:
		n, layout = 4, "raidz2"
	}
	files := make([]string, n)
	for i := range files {
		files[i] = filepath.Join(z.VdevDir, p.Name, fmt.Sprintf("disk-%d.img", i))
	}
	return layout, files
}

// CreatePool implements Backend.
func (z *ZFS) CreatePool(ctx context.Context, p Pool) (PoolState, error) {
	st, err := z.ImportPool(ctx, p)
	if err == nil || !errors.Is(err, ErrNotFound) {
		return st, err
	}
	layout, files := z.vdevs(p)
	if err := os.MkdirAll(filepath.Join(z.VdevDir, p.Name), 0o750); err != nil {
		return PoolState{}, fmt.Errorf("creating vdev directory: %w", err)
	}
	for _, f := range files {
		if err := sparseFile(f, p.Capacity); err != nil {
			return PoolState{}, err
		}
	}
	args := []string{"create", "-f", "-m", "none", z.zpool(p)}
	if layout != "" {
		args = append(args, layout)
	}
	args = append(args, files...)
	if _, err := z.Runner.Run(ctx, "zpool", args...); err != nil {
		return PoolState{}, fmt.Errorf("creating zpool: %w", err)
	}
	return z.poolState(ctx, p)
}

// ImportPool implements Backend: a pool that is not imported (after a reboot) is
// imported from its vdev directory.
func (z *ZFS) ImportPool(ctx context.Context, p Pool) (PoolState, error) {
	st, err := z.poolState(ctx, p)
	if !errors.Is(err, ErrNotFound) {
		return st, err
	}
	if _, err := z.Runner.Run(ctx, "zpool", "import", "-d", filepath.Join(z.VdevDir, p.Name), z.zpool(p)); err != nil {
		if strings.Contains(err.Error(), "no such pool") || strings.Contains(err.Error(), "no pools available") {
			return PoolState{}, fmt.Errorf("zpool %s: %w", z.zpool(p), ErrNotFound)
		}
		return PoolState{}, fmt.Errorf("importing zpool: %w", err)
	}
	return z.poolState(ctx, p)
}

func (z *ZFS) poolState(ctx context.Context, p Pool) (PoolState, error) {
	out, err := z.Runner.Run(ctx, "zpool", "list", "-Hp", "-o", "health,size,allocated,free", z.zpool(p))
	if err != nil {
		if strings.Contains(err.Error(), "no such pool") {
			return PoolState{}, fmt.Errorf("zpool %s: %w", z.zpool(p), ErrNotFound)
		}
		return PoolState{}, fmt.Errorf("listing zpool: %w", err)
	}
	f := strings.Fields(string(out))
	if len(f) != 4 {
		return PoolState{}, fmt.Errorf("zpool list: unexpected output %q", out)
	}
	nums, err := parseInts(f[1:])
	if err != nil {
		return PoolState{}, fmt.Errorf("zpool list: %w", err)
	}
	switch f[0] {
	case "ONLINE", "DEGRADED":
	default:
		return PoolState{}, fmt.Errorf("zpool %s is %s", z.zpool(p), f[0])
	}
	return PoolState{Location: z.zpool(p), Total: nums[0], Used: nums[1], Free: nums[2], Degraded: f[0] == "DEGRADED"}, nil
}

// DeletePool implements Backend.
func (z *ZFS) DeletePool(ctx context.Context, p Pool) error {
	if _, err := z.Runner.Run(ctx, "zpool", "destroy", "-f", z.zpool(p)); err != nil && !strings.Contains(err.Error(), "no such pool") {
		return fmt.Errorf("destroying zpool: %w", err)
	}
	if err := os.RemoveAll(filepath.Join(z.VdevDir, p.Name)); err != nil {
		return fmt.Errorf("removing vdevs: %w", err)
	}
	return nil
}

// CreateReplica implements Backend.
func (z *ZFS) CreateReplica(ctx context.Context, p Pool, r Replica) (ReplicaState, error) {
	st, err := z.StatReplica(ctx, p, r)
	if err == nil && st.Size < volSize(r.Capacity) {
		return z.grow(ctx, p, r) // spec.capacity grew before the replica was recorded
	}
	if err == nil || !errors.Is(err, ErrNotFound) {
		return st, err
	}
	size := volSize(r.Capacity)
	if _, err := z.Runner.Run(ctx, "zfs", "create", "-p", "-s", "-V", strconv.FormatInt(size, 10), z.dataset(p, r)); err != nil {
		return ReplicaState{}, fmt.Errorf("creating zvol: %w", err)
	}
	return z.StatReplica(ctx, p, r)
}

// volSize rounds a capacity up to a whole number of zvol blocks.
func volSize(capacity int64) int64 {
	return (capacity + volBlockSize - 1) / volBlockSize * volBlockSize
}

// GrowReplica implements Backend: volsize is raised (rounded like CreateReplica), never lowered.
func (z *ZFS) GrowReplica(ctx context.Context, p Pool, r Replica) (ReplicaState, error) {
	if r.Capacity <= 0 {
		return ReplicaState{}, fmt.Errorf("growing replica %s/%s to %d bytes: capacity must be positive", r.Namespace, r.Name, r.Capacity)
	}
	st, err := z.StatReplica(ctx, p, r)
	if err != nil || st.Size >= volSize(r.Capacity) {
		return st, err
	}
	return z.grow(ctx, p, r)
}

func (z *ZFS) grow(ctx context.Context, p Pool, r Replica) (ReplicaState, error) {
	size := volSize(r.Capacity)
	if _, err := z.Runner.Run(ctx, "zfs", "set", "volsize="+strconv.FormatInt(size, 10), z.dataset(p, r)); err != nil {
		if msg := err.Error(); strings.Contains(msg, "out of space") || strings.Contains(msg, "greater than available space") {
			return ReplicaState{}, fmt.Errorf("growing zvol to %d bytes: %w: %w", size, ErrNoSpace, err)
		}
		return ReplicaState{}, fmt.Errorf("growing zvol to %d bytes: %w", size, err)
	}
	return z.StatReplica(ctx, p, r)
}

// StatReplica implements Backend.
func (z *ZFS) StatReplica(ctx context.Context, p Pool, r Replica) (ReplicaState, error) {
	ds := z.dataset(p, r)
	out, err := z.Runner.Run(ctx, "zfs", "list", "-Hp", "-o", "volsize,used", ds)
	if err != nil {
		if strings.Contains(err.Error(), "does not exist") {
			return ReplicaState{}, fmt.Errorf("zvol %s: %w", ds, ErrNotFound)
		}
		return ReplicaState{}, fmt.Errorf("listing zvol: %w", err)
	}
	nums, err := parseInts(strings.Fields(string(out)))
	if err != nil || len(nums) != 2 {
		return ReplicaState{}, fmt.Errorf("zfs list: unexpected output %q", out)
	}
	return ReplicaState{Location: "/dev/zvol/" + ds, Size: nums[0], Allocated: nums[1]}, nil
}

// DeleteReplica implements Backend.
func (z *ZFS) DeleteReplica(ctx context.Context, p Pool, r Replica) error {
	_, err := z.Runner.Run(ctx, "zfs", "destroy", z.dataset(p, r))
	if err != nil && !strings.Contains(err.Error(), "does not exist") && !strings.Contains(err.Error(), "no such pool") {
		return fmt.Errorf("destroying zvol: %w", err)
	}
	return nil
}

func parseInts(fields []string) ([]int64, error) {
	nums := make([]int64, len(fields))
	for i, f := range fields {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return nil, err
		}
		nums[i] = n
	}
	return nums, nil
}

func sparseFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o640)
	if err != nil {
		return fmt.Errorf("creating vdev file: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sizing vdev file: %w", err)
	}
	return nil
}
