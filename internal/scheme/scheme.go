// Package scheme is the runtime.Scheme every crdipc component uses: the
// built-in Kubernetes kinds, the VolumeSnapshot kinds (snapshot.storage.k8s.io) and every
// crdipc API group.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"

	bitcoinv1alpha1 "github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
)

// Scheme knows every kind crdipc reads or writes.
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(AddToScheme(Scheme))
}

// AddToScheme adds the built-in kinds and every crdipc group to s.
func AddToScheme(s *runtime.Scheme) error {
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme,
		snapv1.AddToScheme,
		libraryv1alpha1.AddToScheme,
		storagev1alpha1.AddToScheme,
		scmv1alpha1.AddToScheme,
		bitcoinv1alpha1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return err
		}
	}
	return nil
}
