package webhook

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
)

// CachedRecord returns the Delivery record named name as the listener's cache holds it (nil
// if it holds none), and whether the listener has a synced cache at all.
func CachedRecord(ctx context.Context, l *Listener, name string) (rec *scmv1alpha1.Delivery, synced bool) {
	if !l.synced.Load() {
		return nil, false
	}
	rec = &scmv1alpha1.Delivery{}
	if err := l.cache.Get(ctx, client.ObjectKey{Namespace: l.opts.Namespace, Name: name}, rec); err != nil {
		return nil, true
	}
	return rec, true
}
