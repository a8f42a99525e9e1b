package operator

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/storage/dataca"
)

// The operator creates the data-path CA Secret, and reads only it.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=create,namespace=crdipc-system
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get,resourceNames=crdipc-storage-data-ca,namespace=crdipc-system

// caKeeper makes sure the data-path CA exists (package dataca): the node agents wait for it
// before they serve replica data. It runs on the leader, once, retrying until it succeeds.
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
		_, err := dataca.Ensure(ctx, k.r, k.w, install.SystemNamespace)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return nil
		}
		k.log.Error(err, "creating the storage data CA; retrying", "after", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}
