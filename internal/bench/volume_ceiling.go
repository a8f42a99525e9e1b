package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/crdipc/crdipc/internal/storage/blockdev"
)

// ceiling mounts a file system of the measured volume's type on crdipc's block export
// (FUSE file, loop device) of a device held in memory, under dir: the same layers as the
// volume with a Device that costs nothing, so no replicated volume can do better than the
// jobs do there. The returned function unmounts it and ends the export.
func (b *volumeBench) ceiling(ctx context.Context, dir string) (mnt string, done func() error, err error) {
	// Room for both jobs' files and the file system's own metadata.
	size := (b.o.SeqSize + b.o.RandSize + 256*mib + 511) / 512 * 512
	e, err := blockdev.Export(ctx, blockdev.NewMemoryDevice(size), filepath.Join(dir, "export"), blockdev.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return "", nil, fmt.Errorf("exporting a memory device: %w", err)
	}
	mnt = filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o750); err != nil {
		return "", nil, errors.Join(err, e.Close())
	}
	// The way the CSI driver stages a volume: blkid, mkfs, mount (k8s.io/mount-utils).
	m := &mount.SafeFormatAndMount{Interface: mount.New(""), Exec: utilexec.New()}
	if err := m.FormatAndMount(e.Device(), mnt, b.o.FsType, nil); err != nil {
		return "", nil, errors.Join(fmt.Errorf("making and mounting %s on %s: %w", b.o.FsType, e.Device(), err), e.Close())
	}
	return mnt, func() error {
		return errors.Join(m.Unmount(mnt), e.Close())
	}, nil
}
