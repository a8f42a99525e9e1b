package driver

import (
	"context"
	"errors"
	"os"
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
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/scheme"
)

// refusingHost is a node on which nothing may be mounted or unmounted: a test that reaches
// either has let a request through that it must refuse.
func refusingHost(t testing.TB) *host {
	return &host{
		mount: func(src, dst, _ string, _ uintptr, _ string) error {
			t.Errorf("mount of %s on %s", src, dst)
			return unix.EPERM
		},
		unmount: func(p string, _ int) error {
			t.Errorf("unmount of %s", p)
			return unix.EINVAL
		},
		fs:        mount.NewSafeFormatAndMount(mount.NewFakeMounter(nil), utilexec.New()),
		available: func() error { return nil },
	}
}

// nodeDriver is a Node service with the fake client holding objs, kubelet root root and a
// host that refuses to mount.
func nodeDriver(t testing.TB, root string, objs ...client.Object) *Driver {
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(objs...).Build()
	d, err := New(Options{Client: c, NodeID: "n1", TargetDir: t.TempDir(), KubeletRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	d.host = refusingHost(t)
	return d
}

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func TestHostPathStaysInsideItsRoot(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "gone"), filepath.Join(root, "dangling")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "pods"), 0o750); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", ".", "..", "../x", "a/../../x", "a/b", "/etc", "escape", "dangling", "x\x00y"} {
		if p, err := hostPath(root, name); err == nil {
			t.Errorf("hostPath(%q) = %s, want an error", name, p)
		}
	}
	if p, err := hostPath(root, "pvc-1.a"); err != nil || p != filepath.Join(root, "pvc-1.a") {
		t.Errorf("hostPath(pvc-1.a) = %s, %v", p, err)
	}

	for _, p := range []string{
		"relative/path",
		root, // the root itself is no path inside it
		root + "/../" + filepath.Base(root) + "/x", // ".." even where it would come back
		root + "/pods/../../etc",                   // and where it would not
		outside,
		filepath.Join(root, "escape", "target"), // a link leading out
		filepath.Join(root, "dangling", "target"),
		"/",
	} {
		if r, err := underRoot(root, p); err == nil {
			t.Errorf("underRoot(%s) = %s, want an error", p, r)
		}
	}
	for _, p := range []string{filepath.Join(root, "pods"), filepath.Join(root, "pods", "uid", "volumes", "mount"), filepath.Join(root, "plugins") + "/"} {
		if r, err := underRoot(root, p); err != nil || r != filepath.Clean(p) {
			t.Errorf("underRoot(%s) = %s, %v; want it as is", p, r, err)
		}
	}
	// A link leading out is not followed when it is what is to be removed.
	if r, err := contained(root, filepath.Join(root, "escape"), false); err != nil || r != filepath.Join(root, "escape") {
		t.Errorf("underRootNoFollow(escape) = %s, %v", r, err)
	}
}

// A replica whose name in the volume's status would lead out of a pool ("../") stops the
// volume from being staged, before anything is mounted.
func TestStageRefusesReplicaNameWithDotDot(t *testing.T) {
	for _, r := range []storagev1alpha1.VolumeReplicaStatus{
		{Name: "../../etc/passwd", Pool: "p", Node: "n1", Endpoint: "127.0.0.1:1"},
		{Name: "vol-p", Pool: "../p", Node: "n1", Endpoint: "127.0.0.1:1"},
		{Name: "vol-p", Pool: "p", Node: "n1/..", Endpoint: "127.0.0.1:1"},
		{Name: "vol-p", Pool: "p", Node: "n1", Endpoint: "/run/socket"},
	} {
		vol := &storagev1alpha1.CStorVolume{
			ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: "vol"},
			Spec:       storagev1alpha1.CStorVolumeSpec{Capacity: resource.MustParse("8Mi")},
			Status:     storagev1alpha1.CStorVolumeStatus{Replicas: []storagev1alpha1.VolumeReplicaStatus{r}},
		}
		root := t.TempDir()
		d := nodeDriver(t, root, vol)
		staging := filepath.Join(root, "staging")
		_, err := d.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: "vol", StagingTargetPath: staging, VolumeCapability: blockCap()})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "no valid object name") && !strings.Contains(err.Error(), "host:port") {
			t.Errorf("NodeStageVolume with replica %+v: got %v, want FailedPrecondition naming the entry", r, err)
		}
		if d.stagedVolume("vol") != nil {
			t.Errorf("volume staged with replica %+v", r)
		}
		if entries, _ := os.ReadDir(d.o.TargetDir); len(entries) != 0 {
			t.Errorf("target directory holds %v after a refused stage", entries)
		}
	}
}

// Every path of a Node call lies inside the kubelet root, or the call is InvalidArgument
// naming the path and the root, and nothing is made, mounted or removed.
func TestNodeCallsRefusePathsOutsideTheKubeletRoot(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(outside, "keep")
	if err := os.Mkdir(keep, 0o750); err != nil {
		t.Fatal(err)
	}
	d := nodeDriver(t, root)
	inside := filepath.Join(root, "staging")
	mountCap := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	// Not filepath.Join, which would clean the ".." away.
	dotdot := root + "/../" + filepath.Base(outside) + "/keep"
	for _, p := range []string{keep, dotdot, filepath.Join(root, "link", "keep"), "/etc", "relative"} {
		calls := map[string]func() error{
			"NodeStageVolume": func() error {
				_, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vol", StagingTargetPath: p, VolumeCapability: mountCap})
				return err
			},
			"NodePublishVolume target": func() error {
				_, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol", StagingTargetPath: inside, TargetPath: p, VolumeCapability: mountCap})
				return err
			},
			"NodePublishVolume staging": func() error {
				_, err := d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "vol", StagingTargetPath: p, TargetPath: filepath.Join(root, "target"), VolumeCapability: mountCap})
				return err
			},
			"NodeUnpublishVolume": func() error {
				_, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol", TargetPath: p})
				return err
			},
			"NodeUnstageVolume": func() error {
				_, err := d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol", StagingTargetPath: p})
				return err
			},
		}
		for name, call := range calls {
			err := call()
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), root) {
				t.Errorf("%s at %s: got %v, want InvalidArgument naming the path and the kubelet root %s", name, p, err, root)
			}
		}
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("a path outside the kubelet root was removed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "target")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a target was made for a refused call: %v", err)
	}
}

// An extra root admits paths inside it as the kubelet root does, links out of it included
// refused; a path in neither is refused naming both.
func TestExtraRootsAdmitTheirPathsOnly(t *testing.T) {
	ctx := context.Background()
	root, extra, outside := t.TempDir(), t.TempDir(), t.TempDir()
	if err := os.Symlink(outside, filepath.Join(extra, "link")); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).Build()
	d, err := New(Options{Client: c, NodeID: "n1", TargetDir: t.TempDir(), KubeletRoot: root, ExtraRoots: []string{extra}})
	if err != nil {
		t.Fatal(err)
	}
	d.host = refusingHost(t)
	unpublish := func(p string) error {
		_, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: "vol", TargetPath: p})
		return err
	}
	// Nothing is there: unpublished already.
	if err := unpublish(filepath.Join(extra, "target")); err != nil {
		t.Errorf("NodeUnpublishVolume inside the extra root: %v", err)
	}
	for _, p := range []string{filepath.Join(outside, "target"), filepath.Join(extra, "link", "target")} {
		err := unpublish(p)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), root) || !strings.Contains(err.Error(), extra) {
			t.Errorf("NodeUnpublishVolume at %s: %v, want InvalidArgument naming the kubelet root and the extra root", p, err)
		}
	}
	if _, err := New(Options{Client: c, ExtraRoots: []string{"relative"}}); err == nil {
		t.Error("a relative extra root was taken")
	}
}
