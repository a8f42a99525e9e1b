package driver

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
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
	// Mount flags no node accepts are refused up front too.
	suid := mount("ext4")
	suid[0].GetMount().MountFlags = []string{"noatime", "suid"}
	_, err = d.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: suid})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `"suid" is not allowed`) {
		t.Fatalf("CreateVolume with mount flag suid: %v, want InvalidArgument naming it", err)
	}
}

// A unit test with the fake client: a CStorVolume already holding the volume's id for
// another request — another CSI name, or none (made by hand) — is AlreadyExists, never
// taken for the request's volume.
func TestCreateVolumeRefusesAnotherRequestsVolume(t *testing.T) {
	taken := func(annotations map[string]string) *storagev1alpha1.CStorVolume {
		return &storagev1alpha1.CStorVolume{
			ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: "pvc-1", Annotations: annotations},
			Spec:       storagev1alpha1.CStorVolumeSpec{Capacity: resource.MustParse("1Gi")},
		}
	}
	for _, tc := range []struct {
		name string
		vol  *storagev1alpha1.CStorVolume
		want string
	}{
		{name: "another name", vol: taken(map[string]string{AnnotationName: "other"}), want: `volume id pvc-1 belongs to volume name "other"`},
		{name: "made by hand", vol: taken(nil), want: "volume id pvc-1 is taken by a CStorVolume the driver did not create"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithObjects(tc.vol).Build()
			d, err := New(Options{Client: c, Registerer: prometheus.NewRegistry()})
			if err != nil {
				t.Fatal(err)
			}
			_, err = d.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
				Name: "pvc-1", CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30},
				VolumeCapabilities: []*csi.VolumeCapability{{
					AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
					AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
				}},
			})
			if status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("CreateVolume: %v, want AlreadyExists with %q", err, tc.want)
			}
		})
	}
}

// A unit test with the fake client: deleting a clone that never became Ready deletes the
// snapshot of its source it was being filled from (nothing else would, and it would keep
// the source from being deleted), also when CreateVolume took the snapshot and never made
// the volume; a volume restored from a user's snapshot leaves that snapshot alone.
func TestDeleteVolumeDropsTheCloneSnapshot(t *testing.T) {
	ns := install.SystemNamespace
	vol := func(name, source, snap string) *storagev1alpha1.CStorVolume {
		return &storagev1alpha1.CStorVolume{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{AnnotationName: name, AnnotationContentSource: source}},
			Spec:       storagev1alpha1.CStorVolumeSpec{Capacity: resource.MustParse("1Gi"), Source: &storagev1alpha1.VolumeSource{Snapshot: snap}},
		}
	}
	snapshot := func(name, of string) *storagev1alpha1.CStorVolumeSnapshot {
		return &storagev1alpha1.CStorVolumeSnapshot{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec:       storagev1alpha1.CStorVolumeSnapshotSpec{Volume: of},
		}
	}
	// The snapshot CreateVolume of clone "unmade" took before it was cut short.
	unmade := snapshot("clone-unmade", "src")
	unmade.Labels = map[string]string{labelClone: "unmade"}
	c := fake.NewClientBuilder().WithScheme(scheme.Scheme).
		WithIndex(&storagev1alpha1.CStorVolumeSnapshot{}, storagev1alpha1.FieldVolume, func(o client.Object) []string {
			return []string{o.(*storagev1alpha1.CStorVolumeSnapshot).Spec.Volume}
		}).
		WithObjects(
			vol("clone", "volume:src", "clone-snap"), snapshot("clone-snap", "src"),
			vol("restored", "snapshot:users-snap", "users-snap"), snapshot("users-snap", "src"),
			unmade,
		).Build()
	d, err := New(Options{Client: c, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, id := range []string{"clone", "restored", "unmade"} {
		// The fake client's watch does not report the deletion the call then awaits: it
		// says Aborted at its deadline, as for a volume whose replicas are still going.
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := d.DeleteVolume(dctx, &csi.DeleteVolumeRequest{VolumeId: id})
		cancel()
		if err != nil && status.Code(err) != codes.Aborted {
			t.Fatalf("DeleteVolume %s: %v", id, err)
		}
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "clone-snap"}, &storagev1alpha1.CStorVolumeSnapshot{}); !apierrors.IsNotFound(err) {
		t.Errorf("the clone's snapshot after deleting the clone: %v, want it gone", err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "clone-unmade"}, &storagev1alpha1.CStorVolumeSnapshot{}); !apierrors.IsNotFound(err) {
		t.Errorf("the snapshot taken for a clone never made, after deleting the clone: %v, want it gone", err)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "users-snap"}, &storagev1alpha1.CStorVolumeSnapshot{}); err != nil {
		t.Errorf("the user's snapshot after deleting a volume restored from it: %v, want it kept", err)
	}
}
