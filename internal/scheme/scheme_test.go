package scheme_test

import (
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	bitcoinv1alpha1 "github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
	"github.com/crdipc/crdipc/api/conditions"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/config/crd"
	"github.com/crdipc/crdipc/internal/scheme"
)

// records are the crdipc kinds that are no request: nothing reconciles them, so they have
// no Ready condition. A Delivery is the webhook listener's note of a body it stored.
var records = map[string]bool{"Delivery": true}

// kinds are every crdipc kind and the built-in kinds our services read or write, each with
// its list type (nil for a kind that has none).
var kinds = []struct {
	apiVersion, kind string
	obj, list        runtime.Object
}{
	{"library.crdipc.io/v1alpha1", "Book", &libraryv1alpha1.Book{}, &libraryv1alpha1.BookList{}},
	{"storage.crdipc.io/v1alpha1", "StoragePoolClaim", &storagev1alpha1.StoragePoolClaim{}, &storagev1alpha1.StoragePoolClaimList{}},
	{"storage.crdipc.io/v1alpha1", "CStorPool", &storagev1alpha1.CStorPool{}, &storagev1alpha1.CStorPoolList{}},
	{"storage.crdipc.io/v1alpha1", "CStorVolume", &storagev1alpha1.CStorVolume{}, &storagev1alpha1.CStorVolumeList{}},
	{"storage.crdipc.io/v1alpha1", "CStorVolumeReplica", &storagev1alpha1.CStorVolumeReplica{}, &storagev1alpha1.CStorVolumeReplicaList{}},
	{"storage.crdipc.io/v1alpha1", "CStorVolumeSnapshot", &storagev1alpha1.CStorVolumeSnapshot{}, &storagev1alpha1.CStorVolumeSnapshotList{}},
	{"storage.crdipc.io/v1alpha1", "BackupStore", &storagev1alpha1.BackupStore{}, &storagev1alpha1.BackupStoreList{}},
	{"storage.crdipc.io/v1alpha1", "VolumeBackup", &storagev1alpha1.VolumeBackup{}, &storagev1alpha1.VolumeBackupList{}},
	{"scm.crdipc.io/v1alpha1", "PullRequest", &scmv1alpha1.PullRequest{}, &scmv1alpha1.PullRequestList{}},
	{"scm.crdipc.io/v1alpha1", "Branch", &scmv1alpha1.Branch{}, &scmv1alpha1.BranchList{}},
	{"scm.crdipc.io/v1alpha1", "Delivery", &scmv1alpha1.Delivery{}, &scmv1alpha1.DeliveryList{}},
	{"bitcoin.crdipc.io/v1alpha1", "BitcoinNetwork", &bitcoinv1alpha1.BitcoinNetwork{}, &bitcoinv1alpha1.BitcoinNetworkList{}},

	{"v1", "Namespace", &corev1.Namespace{}, &corev1.NamespaceList{}},
	{"v1", "Node", &corev1.Node{}, &corev1.NodeList{}},
	{"v1", "Pod", &corev1.Pod{}, &corev1.PodList{}},
	{"v1", "Binding", &corev1.Binding{}, nil},
	{"v1", "Event", &corev1.Event{}, &corev1.EventList{}},
	{"v1", "ConfigMap", &corev1.ConfigMap{}, &corev1.ConfigMapList{}},
	{"v1", "Secret", &corev1.Secret{}, &corev1.SecretList{}},
	{"v1", "ServiceAccount", &corev1.ServiceAccount{}, &corev1.ServiceAccountList{}},
	{"v1", "Service", &corev1.Service{}, &corev1.ServiceList{}},
	{"v1", "PersistentVolume", &corev1.PersistentVolume{}, &corev1.PersistentVolumeList{}},
	{"v1", "PersistentVolumeClaim", &corev1.PersistentVolumeClaim{}, &corev1.PersistentVolumeClaimList{}},
	{"storage.k8s.io/v1", "StorageClass", &storagev1.StorageClass{}, &storagev1.StorageClassList{}},
	{"storage.k8s.io/v1", "VolumeAttachment", &storagev1.VolumeAttachment{}, &storagev1.VolumeAttachmentList{}},
	{"coordination.k8s.io/v1", "Lease", &coordinationv1.Lease{}, &coordinationv1.LeaseList{}},
	{"apps/v1", "StatefulSet", &appsv1.StatefulSet{}, &appsv1.StatefulSetList{}},
}

// Each kind maps to its Go type and back, in the group and version the CRDs and the API
// server use; each crdipc kind follows the status contract.
func TestSchemeKnowsKinds(t *testing.T) {
	for _, tc := range kinds {
		t.Run(tc.kind, func(t *testing.T) {
			gv, err := schema.ParseGroupVersion(tc.apiVersion)
			if err != nil {
				t.Fatal(err)
			}
			check := func(gvk schema.GroupVersionKind, obj runtime.Object) {
				t.Helper()
				gvks, _, err := scheme.Scheme.ObjectKinds(obj)
				if err != nil || len(gvks) != 1 || gvks[0] != gvk {
					t.Errorf("ObjectKinds(%T) = %v, %v; want [%v]", obj, gvks, err, gvk)
				}
				got, err := scheme.Scheme.New(gvk)
				if err != nil || reflect.TypeOf(got) != reflect.TypeOf(obj) {
					t.Errorf("New(%v) = %T, %v; want %T", gvk, got, err, obj)
				}
			}
			check(gv.WithKind(tc.kind), tc.obj)
			if tc.list != nil {
				check(gv.WithKind(tc.kind+"List"), tc.list)
			}
			if isCrdipc(gv.Group) && !records[tc.kind] {
				if _, ok := tc.obj.(conditions.Object); !ok {
					t.Errorf("%T does not implement conditions.Object (observedGeneration and conditions)", tc.obj)
				}
			}
		})
	}
}

// The table misses no crdipc kind: none that the scheme registers, none that a CRD serves.
func TestEveryCrdipcKindIsInTheTable(t *testing.T) {
	inTable := map[schema.GroupVersionKind]bool{}
	for _, tc := range kinds {
		gv, _ := schema.ParseGroupVersion(tc.apiVersion)
		inTable[gv.WithKind(tc.kind)] = true
		if tc.list != nil {
			inTable[gv.WithKind(tc.kind+"List")] = true
		}
	}
	for gvk, typ := range scheme.Scheme.AllKnownTypes() {
		// Every group version also gets metav1's option and watch-event kinds; only the
		// types of our API packages are kinds of ours.
		if isCrdipc(gvk.Group) && strings.HasPrefix(typ.PkgPath(), "github.com/crdipc/crdipc/api/") && !inTable[gvk] {
			t.Errorf("the scheme registers %v (%v), which the table lacks", gvk, typ)
		}
	}
	crds, err := crd.CRDs()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range crds {
		if !isCrdipc(c.Spec.Group) {
			continue // upstream's (VolumeSnapshot kinds), with clients of their own
		}
		for _, v := range c.Spec.Versions {
			gvk := schema.GroupVersionKind{Group: c.Spec.Group, Version: v.Name, Kind: c.Spec.Names.Kind}
			if !inTable[gvk] || !inTable[gvk.GroupVersion().WithKind(c.Spec.Names.ListKind)] {
				t.Errorf("CRD %s serves %v (list %s), which the table lacks", c.Name, gvk, c.Spec.Names.ListKind)
			}
		}
	}
}

func isCrdipc(group string) bool { return strings.HasSuffix(group, ".crdipc.io") }
