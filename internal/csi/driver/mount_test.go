package driver

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crdipc/crdipc/internal/mountinfo"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/storage/blockdev"
	"github.com/crdipc/crdipc/internal/testenv/require"
)

// requireMounts is testenv.RequireMounts without linking the control plane into this
// package's tests: skip on a host that cannot mount and loop-attach, fail there under
// CRDIPC_REQUIRE_MOUNT=1 (CI).
func requireMounts(t *testing.T) {
	t.Helper()
	require.Capable(t, "CRDIPC_REQUIRE_MOUNT", errors.Join(blockdev.Available(), require.Missing("mkfs.ext4")))
}

// mountOptions are the per-mount options of the topmost mount at path, read from the mount
// table (package mountinfo).
func mountOptions(t *testing.T, path string) []string {
	t.Helper()
	entries, err := mountinfo.Read(mountinfo.Self)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(entries, func(e mountinfo.Entry) bool { return e.MountPoint == path }) {
		t.Fatalf("%s is not a mount point", path)
	}
	m, ok, err := mountAt(path)
	if err != nil || !ok {
		t.Fatalf("mountAt(%s): %v, %v", path, ok, err)
	}
	return m.options
}

// loopDevice attaches file to a free loop device, detached when the test ends.
func loopDevice(t *testing.T, file string) string {
	t.Helper()
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		t.Fatalf("losetup: %v: %s", err, out)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, out)
		}
	})
	return dev
}

// cleanupMount lazily unmounts path when the test ends, whatever happened.
func cleanupMount(t *testing.T, path string) {
	t.Cleanup(func() {
		for isMountPoint(path) {
			if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
				t.Errorf("cleaning up the mount at %s: %v", path, err)
				return
			}
		}
	})
}

// What the driver mounts for a pod is nodev and nosuid (a block volume, a device node
// itself, nosuid), and NodeUnpublishVolume unmounts and removes what it published for the
// volume, and only that. The volume is a loop device of a file in the volume's target
// directory, as the volume target's FUSE file is; staging and targets are at kubelet's paths.
func TestPublishedMountsAreNodevNosuid(t *testing.T) {
	requireMounts(t)
	ctx := context.Background()
	root := t.TempDir()
	d, err := New(Options{Client: fake.NewClientBuilder().WithScheme(scheme.Scheme).Build(), NodeID: "n1", TargetDir: t.TempDir(), KubeletRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := d.targetDir("vol")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "volume")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, 64<<20); err != nil {
		t.Fatal(err)
	}
	dev := loopDevice(t, file)

	staging := filepath.Join(root, "plugins", "kubernetes.io", "csi", Name, "vol", "globalmount")
	if err := os.MkdirAll(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	cleanupMount(t, staging)
	if err := d.stageMount("vol", dev, staging, "ext4", nil); err != nil {
		t.Fatalf("staging: %v", err)
	}
	want := func(path string, opts ...string) {
		t.Helper()
		have := mountOptions(t, path)
		for _, o := range opts {
			if !slices.Contains(have, o) {
				t.Errorf("%s is mounted %s, without %s", path, strings.Join(have, ","), o)
			}
		}
	}
	want(staging, "nodev", "nosuid")

	pod := filepath.Join(root, "pods", "uid", "volumes", "kubernetes.io~csi", "pv")
	target, roTarget := filepath.Join(pod, "mount"), filepath.Join(pod, "ro", "mount")
	for _, p := range []string{target, roTarget} {
		cleanupMount(t, p)
	}
	for range 2 { // publishing twice is publishing once
		if err := d.publishMount("vol", dev, staging, target, false); err != nil {
			t.Fatalf("publishing: %v", err)
		}
	}
	if err := d.publishMount("vol", dev, staging, roTarget, true); err != nil {
		t.Fatalf("publishing read-only: %v", err)
	}
	want(target, "rw", "nodev", "nosuid")
	want(roTarget, "ro", "nodev", "nosuid")
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("x"), 0o600); err != nil {
		t.Fatalf("writing to the published volume: %v", err)
	}

	// Block access: the loop device's node, which nodev would make unopenable.
	blockTarget := filepath.Join(root, "plugins", "kubernetes.io", "csi", "volumeDevices", "publish", "pv", "uid")
	if err := os.MkdirAll(filepath.Dir(blockTarget), 0o750); err != nil {
		t.Fatal(err)
	}
	cleanupMount(t, blockTarget)
	if err := d.publishBlock("vol", dev, blockTarget, false); err != nil {
		t.Fatalf("publishing the block device: %v", err)
	}
	want(blockTarget, "nosuid")
	f, err := os.Open(blockTarget)
	if err != nil {
		t.Fatalf("opening the published block device: %v", err)
	}
	f.Close()

	// Another volume's unpublish does not take this one's mounts.
	if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "other", TargetPath: target}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("NodeUnpublishVolume of another volume at this one's target: got %v, want FailedPrecondition", err)
	}
	for _, p := range []string{target, roTarget, blockTarget} {
		for range 2 { // unpublishing twice is unpublishing once
			if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol", TargetPath: p}); err != nil {
				t.Fatalf("NodeUnpublishVolume at %s: %v", p, err)
			}
		}
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("target %s after NodeUnpublishVolume: %v, want it removed", p, err)
		}
	}
	if err := d.unmountAll("vol", staging); err != nil {
		t.Fatalf("unstaging: %v", err)
	}
	if isMountPoint(staging) {
		t.Errorf("%s is still mounted after unstaging", staging)
	}
}

// A mount at the target that is not the volume as the driver publishes it — here a bind
// mount of some directory — is refused by NodeUnpublishVolume: left mounted, not removed.
func TestNodeUnpublishLeavesAForeignMount(t *testing.T) {
	requireMounts(t)
	root := t.TempDir()
	d := nodeDriver(t, root) // its host fails the test on any unmount
	foreign := t.TempDir()
	if err := os.WriteFile(filepath.Join(foreign, "precious"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(root, "pods", "uid", "volumes", "kubernetes.io~csi", "pv", "mount")
	if err := os.MkdirAll(target, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(foreign, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	cleanupMount(t, target)
	_, err := d.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "vol", TargetPath: target})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "not unmounting") {
		t.Fatalf("NodeUnpublishVolume at a foreign mount: got %v, want FailedPrecondition", err)
	}
	if !isMountPoint(target) {
		t.Fatalf("the foreign mount at %s was unmounted", target)
	}
	if _, err := os.Stat(filepath.Join(target, "precious")); err != nil {
		t.Errorf("the foreign mount's content: %v", err)
	}
}

// A clone or a restored snapshot of an XFS volume holds its source's file system UUID; both
// stage on one node when a pod uses both (Kubernetes' storage e2e suite, multiVolume "volume
// and its clone … on the same node" for xfs): the second mount must not be refused.
func TestXFSCopyStagesBesideItsSource(t *testing.T) {
	requireMounts(t)
	require.Capable(t, "CRDIPC_REQUIRE_MOUNT", require.Missing("mkfs.xfs"))
	root := t.TempDir()
	d, err := New(Options{Client: fake.NewClientBuilder().WithScheme(scheme.Scheme).Build(), NodeID: "n1", TargetDir: t.TempDir(), KubeletRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	stage := func(id, dev string) error {
		staging := filepath.Join(root, id, "globalmount")
		if err := os.MkdirAll(staging, 0o750); err != nil {
			t.Fatal(err)
		}
		cleanupMount(t, staging)
		return d.stageMount(id, dev, staging, "xfs", nil)
	}

	// The source, formatted by its first stage (mkfs.xfs makes nothing below 300 MB).
	source := filepath.Join(t.TempDir(), "source")
	if err := os.WriteFile(source, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(source, 320<<20); err != nil {
		t.Fatal(err)
	}
	if err := stage("source", loopDevice(t, source)); err != nil {
		t.Fatalf("staging the source: %v", err)
	}
	// Its copy, block for block, as a clone's replicas are filled.
	clone := filepath.Join(t.TempDir(), "clone")
	if out, err := exec.Command("cp", "--sparse=always", source, clone).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	if err := stage("clone", loopDevice(t, clone)); err != nil {
		t.Fatalf("staging the clone beside its source: %v", err)
	}
}
