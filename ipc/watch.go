package ipc

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// Watch makes a receiver call its handler when objects other than its
// requests change: a request whose outcome depends on other objects (a
// volume waiting for pools, a pool waiting for its replicas to go) is then
// handled again as soon as they change, instead of on a timer.
type Watch struct {
	// Object is the kind to watch, e.g. &corev1.Node{}. It is read through
	// the manager's cache, so the manager's cache options (label or field
	// selectors) apply.
	Object client.Object
	// Map returns the requests to handle again when obj changes. For a
	// deleted object, obj is its last known state.
	Map func(ctx context.Context, obj client.Object) []reconcile.Request
	// Predicates filter the events before Map; all must pass. None: every
	// create, update and delete.
	Predicates []predicate.Predicate
}

// addWatches adds o.Watches to a receiver's controller. Unlike the request
// kind's own events, these are not filtered by requestChanged: a status
// change of another object is exactly what such a request waits for.
func addWatches(b *builder.Builder, watches []Watch) *builder.Builder {
	for _, w := range watches {
		b = b.Watches(w.Object, handler.EnqueueRequestsFromMapFunc(w.Map), builder.WithPredicates(w.Predicates...))
	}
	return b
}
