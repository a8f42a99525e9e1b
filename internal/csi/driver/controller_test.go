package driver

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crdipc/crdipc/internal/scheme"
)

// A unit test with the fake client: a file system no node would make is refused when the
// volume is created, not first when a node stages it.
func TestCreateVolumeRefusesUnsupportedFsType(t *testing.T) {
	d, err := New(Options{Client: fake.NewClientBuilder().WithScheme(scheme.Scheme).Build(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	mount := func(fs string) []*csi.VolumeCapability {
		return []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}}
	}
	_, err = d.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: mount("btrfs")})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `"btrfs" is not supported`) {
		t.Fatalf("CreateVolume with fsType btrfs: %v, want InvalidArgument naming it", err)
	}
	for _, fs := range []string{"", "ext4", "xfs"} {
		if msg := unsupported(mount(fs)[0]); msg != "" {
			t.Errorf("fsType %q refused: %s", fs, msg)
		}
	}
}
