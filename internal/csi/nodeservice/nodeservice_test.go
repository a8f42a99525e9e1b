package nodeservice_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/csi/nodeservice"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The node plugin's identity (config/rbac/csi-node) reads the volumes it stages and the
// published data CA certificate, and nothing more: creating, changing or deleting a
// CStorVolume is refused, as is every Secret, the data CA's (its key) first.
func TestNodePluginIdentityIsReadOnly(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	as, err := client.New(env.AsServiceAccount(t, "csi-node"), client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	vol := &storagev1alpha1.CStorVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: "csi-node-rbac"},
		Spec:       storagev1alpha1.CStorVolumeSpec{Capacity: resource.MustParse("1Mi")},
	}
	if err := env.Client.Create(ctx, vol); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), vol) })
	for _, name := range []string{storagev1alpha1.DataCASecret, "other"} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: name}}
		if err := env.Client.Create(ctx, s); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}

	if err := as.Get(ctx, client.ObjectKeyFromObject(vol), &storagev1alpha1.CStorVolume{}); err != nil {
		t.Errorf("getting a CStorVolume: %v", err)
	}
	if err := as.List(ctx, &storagev1alpha1.CStorVolumeList{}, client.InNamespace(install.SystemNamespace)); err != nil {
		t.Errorf("listing CStorVolumes (the CSI Probe): %v", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: storagev1alpha1.DataCAConfigMap}}
	if err := env.Client.Create(ctx, cm); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	if err := as.Get(ctx, client.ObjectKeyFromObject(cm), &corev1.ConfigMap{}); err != nil {
		t.Errorf("getting the published data CA certificate: %v", err)
	}

	forbidden := map[string]error{
		"creating a CStorVolume": as.Create(ctx, &storagev1alpha1.CStorVolume{
			ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: "csi-node-made"},
			Spec:       storagev1alpha1.CStorVolumeSpec{Capacity: resource.MustParse("1Mi")},
		}),
		"deleting a CStorVolume":          as.Delete(ctx, vol.DeepCopy()),
		"patching a CStorVolume":          as.Patch(ctx, vol.DeepCopy(), client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"labels":{"x":"y"}}}`))),
		"getting the data CA Secret":      as.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: storagev1alpha1.DataCASecret}, &corev1.Secret{}),
		"getting another Secret":          as.Get(ctx, client.ObjectKey{Namespace: install.SystemNamespace, Name: "other"}, &corev1.Secret{}),
		"listing Secrets":                 as.List(ctx, &corev1.SecretList{}, client.InNamespace(install.SystemNamespace)),
		"getting a CStorVolume elsewhere": as.Get(ctx, client.ObjectKey{Namespace: "default", Name: vol.Name}, &storagev1alpha1.CStorVolume{}),
	}
	for what, err := range forbidden {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s as crdipc-csi-node: %v, want Forbidden", what, err)
		}
	}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vol), &storagev1alpha1.CStorVolume{}); err != nil {
		t.Errorf("the volume after the node plugin's delete: %v", err)
	}
}

// A Set's node plugins act as the identity they are given and stage only inside the
// kubelet root: a volume the API server does not know is NotFound (read, not Forbidden), a
// staging path outside the root InvalidArgument naming it.
func TestSetServesNodesInsideTheKubeletRoot(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	if _, err := nodeservice.New(nodeservice.Options{Config: env.Config, Dir: t.TempDir()}); err == nil {
		t.Error("New without a kubelet root: no error")
	}
	// Unix socket paths are short: not under the test's long temporary directory.
	dir, err := os.MkdirTemp("", "nodeservice")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	root := t.TempDir()
	set, err := nodeservice.New(nodeservice.Options{Config: env.AsServiceAccount(t, "csi-node"), Dir: dir, KubeletRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(set.Stop)
	if _, err := set.Client("../node"); err == nil {
		t.Error("a node plugin for node name ../node: no error")
	}
	nc, err := set.Client("node-1")
	if err != nil {
		t.Fatal(err)
	}
	block := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	staging := filepath.Join(root, "plugins", "kubernetes.io", "csi", "csi.crdipc.io", "h", "globalmount")
	_, err = nc.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "no-such-volume", StagingTargetPath: staging, VolumeCapability: block})
	if status.Code(err) != codes.NotFound {
		t.Errorf("NodeStageVolume of a missing volume: %v, want NotFound", err)
	}
	outside := t.TempDir()
	_, err = nc.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "no-such-volume", StagingTargetPath: outside, VolumeCapability: block})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), outside) || !strings.Contains(err.Error(), root) {
		t.Errorf("NodeStageVolume outside the kubelet root: %v, want InvalidArgument naming %s and %s", err, outside, root)
	}
}
