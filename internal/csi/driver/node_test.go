package driver

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/scheme"
)

// A unit test with the fake client: the Node service on a host that cannot present a volume
// as a block device (no /dev/fuse, no loop devices, no mount privilege), played by swapping
// the driver's host. Staging, publishing and the data path for real are tested in
// internal/csi/e2e.
func TestNodeWithoutBlockDevices(t *testing.T) {
	ctx := context.Background()
	vol := &storagev1alpha1.CStorVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: "vol"},
		Spec:       storagev1alpha1.CStorVolumeSpec{Capacity: resource.MustParse("8Mi")},
		Status:     storagev1alpha1.CStorVolumeStatus{Replicas: []storagev1alpha1.VolumeReplicaStatus{{Name: "vol-p", Pool: "p", Node: "n1", Endpoint: "127.0.0.1:1"}}},
	}
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(vol).Build()
	dir := t.TempDir()
	d, err := New(Options{Client: c, NodeID: "n1", TargetDir: t.TempDir(), KubeletRoot: dir})
	if err != nil {
		t.Fatal(err)
	}
	d.host = &host{
		mount: func(_, _, _ string, _ uintptr, _ string) error { return unix.EPERM },
		unmount: func(p string, _ int) error {
			t.Errorf("unmount of %s on a host that mounted nothing", p)
			return unix.EINVAL
		},
		fs:        mount.NewSafeFormatAndMount(mount.NewFakeMounter(nil), utilexec.New()),
		available: func() error { return errors.New("no /dev/fuse") },
	}
	mountCap := func(fsType string) *csi.VolumeCapability {
		return &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}
	}
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")

	// The reason reaches the CO (and so a user's kubectl describe pod).
	_, err = d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol", StagingTargetPath: staging, VolumeCapability: mountCap("")})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "no /dev/fuse") {
		t.Fatalf("NodeStageVolume on a host without block devices: got %v, want FailedPrecondition naming the reason", err)
	}
	publish := &csi.NodePublishVolumeRequest{VolumeId: "vol", StagingTargetPath: staging, TargetPath: target, VolumeCapability: mountCap("ext4")}
	if _, err := d.NodePublishVolume(ctx, publish); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("NodePublishVolume of an unstaged volume: got %v, want FailedPrecondition", err)
	}
	// Nothing staged, nothing to undo: success, twice.
	for range 2 {
		if _, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol", TargetPath: target}); err != nil {
			t.Fatalf("NodeUnpublishVolume: %v", err)
		}
		if _, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol", StagingTargetPath: staging}); err != nil {
			t.Fatalf("NodeUnstageVolume: %v", err)
		}
	}

	// Refused before any work: unknown volume, unsupported file system, a flag that would
	// change what is mounted, an access mode the driver does not offer.
	for _, k := range []struct {
		req  *csi.NodeStageVolumeRequest
		want codes.Code
	}{
		{&csi.NodeStageVolumeRequest{VolumeId: "nope", StagingTargetPath: staging, VolumeCapability: mountCap("")}, codes.NotFound},
		{&csi.NodeStageVolumeRequest{VolumeId: "vol", StagingTargetPath: staging, VolumeCapability: mountCap("btrfs")}, codes.InvalidArgument},
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
