package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/storage/backend"
)

// A unit test with the fake client: the Node service on a host that refuses mount(2) with
// EPERM (no CAP_SYS_ADMIN), played by swapping the driver's host. blkid and mkfs are real:
// they need no privilege. The real mounts are tested in internal/csi/e2e.

// refusingMounter answers every mount(8) as it does without CAP_SYS_ADMIN.
type refusingMounter struct{ *mount.FakeMounter }

func (refusingMounter) MountSensitive(_, target, _ string, _, _ []string) error {
	return fmt.Errorf("mount failed: exit status 32\nMounting command: mount\nOutput: mount: %s: permission denied.", target)
}

func TestNodeWithoutMountPrivilege(t *testing.T) {
	for _, tool := range []string{"blkid", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("this host has no %s: %v", tool, err)
		}
	}
	ctx := context.Background()
	root := t.TempDir()
	rep := backend.Replica{Namespace: install.SystemNamespace, Name: "vol-0", Capacity: 8 << 20}
	replica := backend.NewFile(root).ReplicaPath("pool", rep)
	if err := os.MkdirAll(filepath.Dir(replica), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(replica, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(replica, rep.Capacity); err != nil {
		t.Fatal(err)
	}
	vol := &storagev1alpha1.CStorVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: "vol"},
		Status:     storagev1alpha1.CStorVolumeStatus{Replicas: []storagev1alpha1.VolumeReplicaStatus{{Name: rep.Name, Pool: "pool", Node: "n1"}}},
	}
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(vol).Build()
	d, err := New(Options{Client: c, NodeID: "n1", Root: root})
	if err != nil {
		t.Fatal(err)
	}
	d.host = &host{
		mount: func(_, _, _ string, _ uintptr, _ string) error { return unix.EPERM },
		unmount: func(p string, _ int) error {
			t.Errorf("unmount of %s on a host that mounted nothing", p)
			return unix.EINVAL
		},
		fs:          mount.NewSafeFormatAndMount(refusingMounter{mount.NewFakeMounter(nil)}, utilexec.New()),
		loopControl: "/dev/loop-control",
	}

	capability := func(fsType string) *csi.VolumeCapability {
		return &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}
	}
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	stage := func(fsType string) error {
		_, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol", StagingTargetPath: staging, VolumeCapability: capability(fsType)})
		return err
	}
	linksTo := func(path string) string {
		t.Helper()
		cur, err := os.Readlink(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return cur
	}

	if err := stage(""); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if got := linksTo(filepath.Join(staging, LinkName)); got != replica {
		t.Fatalf("staging link to %s, want %s", got, replica)
	}
	uuid := blkidTag(t, replica, "UUID")
	if got := blkidTag(t, replica, "TYPE"); got != "ext4" || uuid == "" {
		t.Fatalf("replica holds %q (uuid %q), want ext4 made although the mount was refused", got, uuid)
	}
	if err := stage("ext4"); err != nil {
		t.Fatalf("NodeStageVolume again: %v", err)
	}
	if err := stage("ext3"); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("NodeStageVolume as ext3 where staged as ext4: got %v, want AlreadyExists", err)
	}
	if u := blkidTag(t, replica, "UUID"); u != uuid {
		t.Fatalf("uuid %s, was %s: reformatted", u, uuid)
	}

	publish := &csi.NodePublishVolumeRequest{VolumeId: "vol", StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability("ext4")}
	for range 2 {
		if _, err := d.NodePublishVolume(ctx, publish); err != nil {
			t.Fatalf("NodePublishVolume: %v", err)
		}
	}
	if got := linksTo(filepath.Join(target, LinkName)); got != replica {
		t.Fatalf("target link to %s, want %s", got, replica)
	}
	for range 2 {
		if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol", TargetPath: target}); err != nil {
			t.Fatalf("NodeUnpublishVolume: %v", err)
		}
		if _, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol", StagingTargetPath: staging}); err != nil {
			t.Fatalf("NodeUnstageVolume: %v", err)
		}
	}
	if _, err := os.Lstat(target); !os.IsNotExist(err) {
		t.Fatalf("target after NodeUnpublishVolume: %v", err)
	}
	if entries, err := os.ReadDir(staging); err != nil || len(entries) != 0 {
		t.Fatalf("staging directory after NodeUnstageVolume: %v, %v (want it kept, empty)", entries, err)
	}
	if _, err := d.NodePublishVolume(ctx, publish); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("NodePublishVolume of an unstaged volume: got %v, want FailedPrecondition", err)
	}
	if _, err := os.Stat(replica); err != nil {
		t.Fatalf("replica file after unstaging: %v", err)
	}

	// Block: staging records nothing; publishing links the replica file itself.
	block := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	blockStaging := filepath.Join(dir, "block-staging")
	if _, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol", StagingTargetPath: blockStaging, VolumeCapability: block}); err != nil {
		t.Fatalf("NodeStageVolume, block: %v", err)
	}
	if _, err := os.Lstat(blockStaging); !os.IsNotExist(err) {
		t.Fatalf("block staging recorded something: %v", err)
	}
	blockTarget := filepath.Join(dir, "block")
	if _, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol", StagingTargetPath: blockStaging, TargetPath: blockTarget, VolumeCapability: block}); err != nil {
		t.Fatalf("NodePublishVolume, block: %v", err)
	}
	if got := linksTo(blockTarget); got != replica {
		t.Fatalf("block target links to %s, want %s", got, replica)
	}
	if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol", TargetPath: blockTarget}); err != nil {
		t.Fatalf("NodeUnpublishVolume, block: %v", err)
	}
	if _, err := os.Lstat(blockTarget); !os.IsNotExist(err) {
		t.Fatalf("block target after NodeUnpublishVolume: %v", err)
	}

	// Refused before any work: unknown volume, unsupported file system, a flag that would
	// change what is mounted.
	for _, k := range []struct {
		req  *csi.NodeStageVolumeRequest
		want codes.Code
	}{
		{&csi.NodeStageVolumeRequest{VolumeId: "nope", StagingTargetPath: staging, VolumeCapability: capability("")}, codes.NotFound},
		{&csi.NodeStageVolumeRequest{VolumeId: "vol", StagingTargetPath: staging, VolumeCapability: capability("btrfs")}, codes.InvalidArgument},
		{&csi.NodeStageVolumeRequest{VolumeId: "vol", StagingTargetPath: staging, VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{MountFlags: []string{"offset=4096"}}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}}, codes.InvalidArgument},
		{&csi.NodeStageVolumeRequest{VolumeId: "vol", StagingTargetPath: staging, VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER},
		}}, codes.InvalidArgument},
	} {
		if _, err := d.NodeStageVolume(ctx, k.req); status.Code(err) != k.want {
			t.Errorf("NodeStageVolume(%v): got %v, want %s", k.req, err, k.want)
		}
	}
}

// blkidTag returns the value of tag (TYPE, UUID) of the file system in file, "" for none.
func blkidTag(t *testing.T, file, tag string) string {
	t.Helper()
	out, err := exec.Command("blkid", "-p", "-s", tag, "-o", "value", file).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 2 {
		return ""
	}
	if err != nil {
		t.Fatalf("blkid %s: %v", file, err)
	}
	return strings.TrimSpace(string(out))
}
