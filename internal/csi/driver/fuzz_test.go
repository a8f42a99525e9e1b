package driver

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/crdipc/crdipc/internal/scheme"
)

// Fuzz targets for the validation of CreateVolume, NodeStageVolume and NodePublishVolume:
// whatever a CO sends, the driver does not panic, answers a request that is plainly wrong
// with InvalidArgument (never OK), and lets through only paths inside the kubelet root. The
// fuzzed requests reach the validation only: CreateVolume's first API call fails on
// purpose, and the Node calls are checked by checkStage and checkPublish, which run before
// anything on the node changes. `go test` runs the seeds; `go test -fuzz FuzzX` explores.

// fuzzCapability builds a volume capability from fuzzed parts: access type 0 none, 1
// mount, 2 block, 3 no capability at all.
func fuzzCapability(access uint8, mode int32, fsType, flag string) *csi.VolumeCapability {
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_Mode(mode)}}
	switch access % 4 {
	case 1:
		m := &csi.VolumeCapability_MountVolume{FsType: fsType}
		if flag != "" {
			m.MountFlags = []string{flag}
		}
		c.AccessType = &csi.VolumeCapability_Mount{Mount: m}
	case 2:
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	case 3:
		return nil
	}
	return c
}

// badCapability reports whether a capability is one no call accepts: none, no access type,
// an access mode of more than one node, a file system or mount flag the driver refuses.
func badCapability(c *csi.VolumeCapability) bool {
	if c == nil || (c.GetMount() == nil && c.GetBlock() == nil) {
		return true
	}
	switch c.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER, csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
	default:
		return true
	}
	if t := c.GetMount().GetFsType(); t != "" && !slices.Contains(fsTypes, t) {
		return true
	}
	return false
}

// badFlag reports whether a mount flag is one the Node service refuses.
func badFlag(c *csi.VolumeCapability) bool {
	for _, f := range c.GetMount().GetMountFlags() {
		name, _, _ := strings.Cut(f, "=")
		if f == "" || strings.ContainsAny(f, ", \t\n") ||
			slices.Contains([]string{"bind", "rbind", "remount", "move", "loop", "offset", "sizelimit", "dev", "suid", "defaults"}, name) {
			return true
		}
	}
	return false
}

// outside reports whether a request path is plainly not one inside root.
func outside(root, p string) bool {
	return p == "" || !filepath.IsAbs(p) || slices.Contains(strings.Split(p, "/"), "..") ||
		!strings.HasPrefix(filepath.Clean(p), root+"/")
}

func FuzzCreateVolumeRequest(f *testing.F) {
	f.Add("pvc-1", int64(1<<20), int64(0), "ext4", uint8(1), int32(1), "replicaCount", "3", "", false)
	f.Add("", int64(0), int64(0), "", uint8(2), int32(1), "", "", "", false)
	f.Add("v", int64(-1), int64(0), "", uint8(1), int32(1), "", "", "", false)
	f.Add("v", int64(10), int64(5), "", uint8(1), int32(1), "", "", "", false)
	f.Add("v", int64(0), int64(0), "btrfs", uint8(1), int32(1), "", "", "", false)
	f.Add("v", int64(0), int64(0), "", uint8(0), int32(1), "", "", "", false)
	f.Add("v", int64(0), int64(0), "", uint8(2), int32(5), "", "", "", false)
	f.Add("v", int64(0), int64(0), "", uint8(2), int32(1), "replicaCount", "9", "", false)
	f.Add("v", int64(0), int64(0), "", uint8(2), int32(1), "consistencyFactor", "4", "", false)
	f.Add("v", int64(0), int64(0), "", uint8(2), int32(1), "color", "red", "", false)
	f.Add("v", int64(0), int64(0), "", uint8(2), int32(1), "", "", "", true)
	f.Add("../../x", int64(0), int64(0), "", uint8(1), int32(1), "", "", "bind", false)
	f.Fuzz(func(t *testing.T, name string, required, limit int64, fsType string, access uint8, mode int32, key, value, flag string, source bool) {
		// Validation passed once the driver looks the volume up: that lookup fails here.
		c := fake.NewClientBuilder().WithScheme(scheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
			Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
				return apierrors.NewServiceUnavailable("fuzz: validation passed")
			},
			Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error {
				t.Error("CreateVolume created a volume after the lookup failed")
				return nil
			},
		}).Build()
		d, err := New(Options{Client: c})
		if err != nil {
			t.Fatal(err)
		}
		req := &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: required, LimitBytes: limit}}
		if cp := fuzzCapability(access, mode, fsType, flag); cp != nil {
			req.VolumeCapabilities = []*csi.VolumeCapability{cp}
		}
		if key != "" {
			req.Parameters = map[string]string{key: value}
		}
		if source {
			req.VolumeContentSource = &csi.VolumeContentSource{}
		}
		_, err = d.CreateVolume(context.Background(), req)
		code := status.Code(err)
		if code != codes.InvalidArgument && code != codes.Unavailable {
			t.Fatalf("CreateVolume(%v): %v, want InvalidArgument or the failed lookup", req, err)
		}
		if code == codes.Unavailable && !strings.Contains(err.Error(), "fuzz: validation passed") {
			t.Fatalf("CreateVolume(%v): %v", req, err)
		}
		var cp *csi.VolumeCapability
		if len(req.VolumeCapabilities) > 0 {
			cp = req.VolumeCapabilities[0]
		}
		invalid := name == "" || badCapability(cp) || source || required < 0 || limit < 0 || (limit > 0 && required > limit) ||
			(key != "" && key != ParamReplicaCount && key != ParamConsistencyFactor && !strings.HasPrefix(key, "csi.storage.k8s.io/"))
		if invalid && code != codes.InvalidArgument {
			t.Fatalf("CreateVolume(%v) of an invalid request: %v, want InvalidArgument", req, err)
		}
	})
}

func FuzzNodeStageVolumeRequest(f *testing.F) {
	root := fuzzRoot(f)
	f.Add("vol", "plugins/kubernetes.io/csi/csi.crdipc.io/abc/globalmount", uint8(1), int32(1), "ext4", "noatime")
	f.Add("vol", "../etc", uint8(1), int32(1), "", "")
	f.Add("vol", "/etc", uint8(2), int32(1), "", "")
	f.Add("vol", "", uint8(2), int32(1), "", "")
	f.Add("", "staging", uint8(2), int32(1), "", "")
	f.Add("Vol_1", "staging", uint8(2), int32(1), "", "")
	f.Add("vol", "staging", uint8(3), int32(1), "", "")
	f.Add("vol", "staging", uint8(1), int32(1), "btrfs", "")
	f.Add("vol", "staging", uint8(1), int32(1), "", "dev")
	f.Add("vol", "staging", uint8(1), int32(1), "", "offset=4096")
	f.Add("vol", "a/../../b", uint8(1), int32(7), "", "")
	d := nodeDriver(f, root)
	f.Fuzz(func(t *testing.T, id, staging string, access uint8, mode int32, fsType, flag string) {
		// Relative seeds are taken inside the root; absolute ones as they are.
		if staging != "" && !strings.HasPrefix(staging, "/") && !strings.HasPrefix(staging, "..") {
			staging = root + "/" + staging
		}
		req := &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: fuzzCapability(access, mode, fsType, flag)}
		got, _, err := d.checkStage(req)
		checkNodeValidation(t, root, req, err, got, id == "" || badCapability(req.VolumeCapability) || badFlag(req.VolumeCapability) || outside(root, staging))
	})
}

func FuzzNodePublishVolumeRequest(f *testing.F) {
	root := fuzzRoot(f)
	f.Add("vol", "plugins/x/globalmount", "pods/uid/volumes/kubernetes.io~csi/pv/mount", uint8(1), int32(1), "", true)
	f.Add("vol", "", "pods/uid/volumeDevices/pv", uint8(2), int32(1), "", false)
	f.Add("vol", "", "pods/uid/mount", uint8(1), int32(1), "", false)
	f.Add("vol", "staging", "/etc/passwd", uint8(2), int32(1), "", false)
	f.Add("vol", "/tmp/x", "target", uint8(1), int32(1), "", false)
	f.Add("vol", "staging", "pods/../../../target", uint8(1), int32(1), "", false)
	f.Add("vol", "staging", "", uint8(1), int32(1), "", false)
	f.Add("vol", "staging", "target", uint8(0), int32(1), "", false)
	f.Add("vol", "staging", "target", uint8(1), int32(1), "rbind", false)
	f.Add("a..b", "staging", "target", uint8(1), int32(1), "", false)
	d := nodeDriver(f, root)
	f.Fuzz(func(t *testing.T, id, staging, target string, access uint8, mode int32, flag string, readonly bool) {
		for _, p := range []*string{&staging, &target} {
			if *p != "" && !strings.HasPrefix(*p, "/") && !strings.HasPrefix(*p, "..") {
				*p = root + "/" + *p
			}
		}
		req := &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: fuzzCapability(access, mode, "", flag), Readonly: readonly}
		gotStaging, gotTarget, err := d.checkPublish(req)
		block := req.GetVolumeCapability().GetBlock() != nil
		invalid := id == "" || badCapability(req.VolumeCapability) || badFlag(req.VolumeCapability) || outside(root, target) || (!block && outside(root, staging))
		checkNodeValidation(t, root, req, err, gotTarget, invalid)
		if err == nil && !block {
			checkNodeValidation(t, root, req, err, gotStaging, invalid)
		}
	})
}

// fuzzRoot is a kubelet root for a fuzz target, its links resolved as the driver resolves
// the paths it accepts.
func fuzzRoot(f *testing.F) string {
	root, err := filepath.EvalSymlinks(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	return root
}

// checkNodeValidation asserts what a Node call's validation may answer: InvalidArgument for
// an invalid request, NotFound for a volume id no volume can have, or success with a path
// strictly inside the kubelet root.
func checkNodeValidation(t *testing.T, root string, req any, err error, path string, invalid bool) {
	t.Helper()
	switch code := status.Code(err); {
	case invalid && code != codes.InvalidArgument:
		t.Fatalf("%v: %v, want InvalidArgument", req, err)
	case code != codes.OK && code != codes.InvalidArgument && code != codes.NotFound:
		t.Fatalf("%v: %v, want OK, InvalidArgument or NotFound", req, err)
	case code == codes.NotFound && !strings.Contains(err.Error(), "not found"):
		t.Fatalf("%v: %v", req, err)
	case code == codes.OK && !strings.HasPrefix(path, root+"/"):
		t.Fatalf("%v: accepted with path %q, outside the kubelet root %s", req, path, root)
	case code == codes.OK:
		if id := volumeIDOf(req); len(validation.IsDNS1123Subdomain(id)) > 0 {
			t.Fatalf("%v: accepted volume id %q, which no volume has", req, id)
		}
	}
}

func volumeIDOf(req any) string {
	switch r := req.(type) {
	case *csi.NodeStageVolumeRequest:
		return r.GetVolumeId()
	case *csi.NodePublishVolumeRequest:
		return r.GetVolumeId()
	}
	return ""
}
