package operator

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/storage/dataca"
)

// The operator creates the data-path CA Secret, and reads only it: no other part may read
// it (the CA key signs every data-path identity). It publishes the CA certificate in a
// ConfigMap for the data-path parts to trust.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create,namespace=crdipc-system
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get,resourceNames=crdipc-storage-data-ca,namespace=crdipc-system
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=create,namespace=crdipc-system
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;update,resourceNames=crdipc-storage-data-ca,namespace=crdipc-system

// caResync is how often the published CA certificate is checked and put back if someone
// changed or deleted it. Reading one object by name needs no watch of every ConfigMap.
const caResync = time.Minute

// caKeeper makes sure the data-path CA exists (package dataca) and that its certificate is
// published: the node agents wait for it before they request their certificates. It runs
// on the leader, retrying until it succeeds, then keeps the ConfigMap in sync.
type caKeeper struct {
	r   client.Reader
	w   client.Writer
	log logr.Logger
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (k *caKeeper) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable.
func (k *caKeeper) Start(ctx context.Context) error {
	delay := 100 * time.Millisecond
	for {
		err := k.sync(ctx)
		if ctx.Err() != nil {
			return nil
		}
		next := caResync
		if err != nil {
			k.log.Error(err, "keeping the storage data CA; retrying", "after", delay)
			next, delay = delay, min(2*delay, 30*time.Second)
		} else {
			delay = 100 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(next):
		}
	}
}

func (k *caKeeper) sync(ctx context.Context) error {
	ca, err := dataca.Ensure(ctx, k.r, k.w, install.SystemNamespace)
	if err != nil {
		return err
	}
	return dataca.Publish(ctx, k.r, k.w, install.SystemNamespace, ca)
}
