package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of every kind in this package.
var GroupVersion = schema.GroupVersion{Group: "storage.crdipc.io", Version: "v1alpha1"}

// SchemeGroupVersion is GroupVersion under the name generated clients and listers expect.
var SchemeGroupVersion = GroupVersion

var (
	// SchemeBuilder registers this package's kinds. Plain apimachinery rather than
	// controller-runtime's builder keeps the API packages light for importers.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds every kind in this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Resource returns a GroupResource for a plural resource name in this group, as apierrors wants.
func Resource(resource string) schema.GroupResource {
	return GroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion,
		&StoragePoolClaim{}, &StoragePoolClaimList{},
		&CStorPool{}, &CStorPoolList{},
		&CStorVolume{}, &CStorVolumeList{},
		&CStorVolumeReplica{}, &CStorVolumeReplicaList{},
		&CStorVolumeSnapshot{}, &CStorVolumeSnapshotList{},
		&BackupStore{}, &BackupStoreList{},
		&VolumeBackup{}, &VolumeBackupList{},
	)
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
