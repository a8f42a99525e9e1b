package bitcoin

import (
	"context"
	"errors"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	bitcoinv1alpha1 "github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
	"github.com/crdipc/crdipc/api/conditions"
	"github.com/crdipc/crdipc/ipc"
)

// The operator's permissions: its kind; the StatefulSets, Services and Secrets it keeps
// for each network (Secrets are read one by one, never listed or watched; the finalizers
// subresource lets the owner references block deletion); the Pods it
// watches and talks to; Events; Leases for leader election and the receiver heartbeat.
// +kubebuilder:rbac:groups=bitcoin.crdipc.io,resources=bitcoinnetworks,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=bitcoin.crdipc.io,resources=bitcoinnetworks/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=bitcoin.crdipc.io,resources=bitcoinnetworks/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=statefulsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete,namespace=crdipc-system

// Options configure the operator.
type Options struct {
	// Receiver options (concurrency, backoff, leases); Name and Watches are set by Add.
	ipc.Options
	// RPCTimeout bounds one JSON-RPC call to a node; default 5 s.
	RPCTimeout time.Duration
	// Resync is how often a Ready network is checked again (bitcoind forgets added nodes
	// when it restarts); default 30 s. A network still connecting is checked every second.
	Resync time.Duration
}

// Add registers the BitcoinNetwork operator with mgr.
func Add(mgr manager.Manager, o Options) error {
	if o.RPCTimeout == 0 {
		o.RPCTimeout = 5 * time.Second
	}
	if o.Resync == 0 {
		o.Resync = 30 * time.Second
	}
	h := &handler{c: mgr.GetClient(), live: mgr.GetAPIReader(), o: o, rpc: newRPCTransports(o.RPCTimeout)}
	ro := o.Options
	ro.Name = "bitcoinnetwork"
	ro.Watches = append(ro.Watches,
		ipc.Watch{Object: &appsv1.StatefulSet{}, Map: byNetworkLabel},
		ipc.Watch{Object: &corev1.Pod{}, Map: byNetworkLabel},
	)
	return ipc.Register(mgr, &bitcoinv1alpha1.BitcoinNetwork{}, ipc.Handler[*bitcoinv1alpha1.BitcoinNetwork](h), ro)
}

// byNetworkLabel maps a pod or StatefulSet to the network named by its NetworkLabel.
func byNetworkLabel(_ context.Context, obj client.Object) []reconcile.Request {
	name := obj.GetLabels()[NetworkLabel]
	if name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: obj.GetNamespace(), Name: name}}}
}

// secretRecheck is how often a network waiting for its Secret looks for it again.
const secretRecheck = 3 * time.Second

type handler struct {
	c    client.Client
	live client.Reader
	o    Options
	rpc  rpcTransports
}

// waitingError is a state of the world the network waits on (a missing Secret), not a
// failure to retry with backoff.
type waitingError struct{ msg string }

func (e *waitingError) Error() string { return e.msg }

func errWaiting(msg string) error { return &waitingError{msg: msg} }

// Handle implements ipc.Handler: keep the Secret, Service and StatefulSet, then connect the
// ready nodes, in the RPC dialect of the network's implementation, and report.
func (h *handler) Handle(ctx context.Context, n *bitcoinv1alpha1.BitcoinNetwork) (ipc.Result, error) {
	user, pass, err := h.credentials(ctx, n)
	var w *waitingError
	if errors.As(err, &w) {
		// Secrets are not watched (nor cached): look again in a while.
		return ipc.Waiting(conditions.ReasonWaiting, w.msg, secretRecheck), nil
	}
	if err != nil {
		return ipc.Result{}, err
	}
	if err := h.applyService(ctx, n); err != nil {
		return ipc.Result{}, err
	}
	if err := h.applyStatefulSet(ctx, n); err != nil {
		return ipc.Result{}, err
	}
	return h.connect(ctx, n, h.rpc.client(implementation(n), user, pass))
}
