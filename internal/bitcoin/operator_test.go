package bitcoin_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/btcsuite/btcd/rpcclient"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bitcoinv1alpha1 "github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
	"github.com/crdipc/crdipc/api/conditions"
	"github.com/crdipc/crdipc/internal/bitcoin"
	"github.com/crdipc/crdipc/internal/bitcoin/btcd"
	"github.com/crdipc/crdipc/internal/podsim"
	"github.com/crdipc/crdipc/internal/simnode"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/require"
	"github.com/crdipc/crdipc/ipc"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// world is the operator and the simulated nodes' kubelet running for one test, with two
// simulated Nodes, against the package's embedded API server.
type world struct {
	env *testenv.Env
	ns  string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	_, err := (btcd.Image{}).Find()
	require.Capable(t, "CRDIPC_REQUIRE_BTCD", err)
	env := testenv.Get(t)
	w := &world{env: env, ns: env.Namespace(t)}
	root := t.TempDir()
	ctx := context.Background()
	for i := 1; i <= 2; i++ {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("btc-%d", i), Labels: map[string]string{simnode.Label: "true"}}}
		if err := env.Client.Create(ctx, n); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(n), n); err != nil {
			t.Fatal(err)
		}
		// Ready, with the capacity a kubelet reports: without allocatable pods
		// kube-scheduler finds the node full.
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Simulated", LastHeartbeatTime: metav1.Now()}}
		n.Status.Capacity = corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("110"),
		}
		n.Status.Allocatable = n.Status.Capacity
		if err := env.Client.Status().Update(ctx, n); err != nil {
			t.Fatal(err)
		}
		testenv.LiftNotReadyTaint(t, env.Client, n.Name)
	}
	// The operator runs as its ServiceAccount with only the shipped role (config/rbac);
	// the simulated kubelet, which stands in for the cluster, as an admin.
	operator := startManager(t, env.AsServiceAccount(t, "bitcoin-operator"), func(mgr ctrl.Manager) error {
		return bitcoin.Add(mgr, bitcoin.Options{Resync: 2 * time.Second})
	})
	kubelet := startManager(t, env.Config, func(mgr ctrl.Manager) error {
		return podsim.Add(mgr, podsim.Options{Root: root, Images: map[string]podsim.Image{"bitcoin/bitcoin": btcd.Image{}, btcd.NativeImageName: btcd.NativeImage{}}})
	})
	// Stopped before the namespace and root go: the runtime stops every process.
	t.Cleanup(func() { operator(); kubelet() })
	return w
}

// startManager runs a manager with what add registers, and returns its stop function.
func startManager(t *testing.T, cfg *rest.Config, add func(ctrl.Manager) error) func() {
	t.Helper()
	mgr := testenv.NewManager(t, cfg)
	if err := add(mgr); err != nil {
		t.Fatal(err)
	}
	return testenv.Start(t, "manager", mgr.Start)
}

func (w *world) network(name string, nodes int32) *bitcoinv1alpha1.BitcoinNetwork {
	return &bitcoinv1alpha1.BitcoinNetwork{
		ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: name},
		Spec:       bitcoinv1alpha1.BitcoinNetworkSpec{Nodes: nodes, Network: bitcoinv1alpha1.NetworkRegtest, Image: bitcoinv1alpha1.BitcoindImage},
	}
}

// waitNotReady waits until the network reports Ready=False with a message containing why.
func (w *world) waitNotReady(t *testing.T, n *bitcoinv1alpha1.BitcoinNetwork, why string) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "Ready=False saying "+why, func(ctx context.Context) (bool, error) {
		if err := w.env.Client.Get(ctx, client.ObjectKeyFromObject(n), n); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(n.Status.Conditions, conditions.TypeReady)
		if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, why) {
			return false, fmt.Errorf("Ready condition %+v", c)
		}
		return true, nil
	})
}

// peersSeenBy asks every node of the network, with btcd's own RPC client rather than the
// operator's, which other node IPs it is connected to.
func (w *world) peersSeenBy(t *testing.T, n *bitcoinv1alpha1.BitcoinNetwork) map[string][]string {
	t.Helper()
	var s corev1.Secret
	if err := w.env.Client.Get(context.Background(), client.ObjectKey{Namespace: n.Namespace, Name: bitcoin.SecretName(n)}, &s); err != nil {
		t.Fatal(err)
	}
	seen := map[string][]string{}
	for _, nd := range n.Status.Nodes {
		c, err := rpcclient.New(&rpcclient.ConnConfig{
			Host: net.JoinHostPort(nd.IP, strconv.Itoa(int(bitcoin.PortsOf(n.Spec.Implementation, n.Spec.Network).RPC))),
			User: string(s.Data[bitcoin.SecretUser]), Pass: string(s.Data[bitcoin.SecretPassword]),
			HTTPPostMode: true, DisableTLS: true,
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		peers, err := c.GetPeerInfo()
		c.Shutdown()
		if err != nil {
			t.Fatalf("getpeerinfo on %s (%s): %v", nd.Name, nd.IP, err)
		}
		for _, p := range peers {
			host, _, _ := net.SplitHostPort(p.Addr)
			seen[nd.IP] = append(seen[nd.IP], host)
		}
	}
	return seen
}

// A network of three comes up with every node connected to the other two — checked on the
// nodes themselves; scaled to two it loses a node and keeps the link; deleted, everything
// it owned goes with it.
func TestNetworkConnectsScalesAndDeletes(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	n := w.network("net", 3)
	cctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := ipc.Call(cctx, w.env.Client, n, ipc.Ready); err != nil {
		t.Fatalf("network of 3: %v (status %+v)", err, n.Status)
	}
	if n.Status.ReadyNodes != 3 || n.Status.Peers != 3 || len(n.Status.Nodes) != 3 {
		t.Fatalf("status = %+v, want 3 ready nodes and 3 peer links", n.Status)
	}
	for ip, peers := range w.peersSeenBy(t, n) {
		if len(peers) < 2 {
			t.Errorf("node %s is connected to %v, want the other two", ip, peers)
		}
	}
	var sts appsv1.StatefulSet
	if err := w.env.Client.Get(ctx, client.ObjectKeyFromObject(n), &sts); err != nil {
		t.Fatal(err)
	}
	if metav1.GetControllerOf(&sts) == nil || metav1.GetControllerOf(&sts).UID != n.UID {
		t.Errorf("statefulset not owned by the network: %v", sts.OwnerReferences)
	}

	// A patch, not an update: the operator writes the network's status meanwhile.
	before := client.MergeFrom(n.DeepCopy())
	n.Spec.Nodes = 2
	if err := w.env.Client.Patch(ctx, n, before); err != nil {
		t.Fatal(err)
	}
	actx, cancel2 := context.WithTimeout(ctx, 60*time.Second)
	defer cancel2()
	if err := ipc.Await(actx, w.env.Client, n, ipc.Ready); err != nil {
		t.Fatalf("scaled to 2: %v", err)
	}
	if n.Status.ReadyNodes != 2 || n.Status.Peers != 1 || len(n.Status.Nodes) != 2 {
		t.Fatalf("status after scaling to 2 = %+v", n.Status)
	}

	if err := w.env.Client.Delete(ctx, n); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 60*time.Second, "statefulset, service, secret and pods gone", func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := w.env.Client.List(ctx, &pods, client.InNamespace(w.ns), client.MatchingLabels{bitcoin.NetworkLabel: n.Name}); err != nil {
			return false, err
		}
		left := []string{}
		for _, o := range []client.Object{&appsv1.StatefulSet{}, &corev1.Service{}} {
			if err := w.env.Client.Get(ctx, client.ObjectKeyFromObject(n), o); !apierrors.IsNotFound(err) {
				left = append(left, fmt.Sprintf("%T", o))
			}
		}
		if err := w.env.Client.Get(ctx, client.ObjectKey{Namespace: w.ns, Name: bitcoin.SecretName(n)}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			left = append(left, "secret")
		}
		if len(left) != 0 || len(pods.Items) != 0 {
			return false, fmt.Errorf("left %v, %d pods", left, len(pods.Items))
		}
		return true, nil
	})
}

// A network whose Secret does not exist waits, saying so, and comes up once it does.
func TestWaitsForItsSecret(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	n := w.network("own-secret", 1)
	n.Spec.SecretName = "rpc-credentials"
	if err := w.env.Client.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	w.waitNotReady(t, n, "rpc-credentials")
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "rpc-credentials"},
		StringData: map[string]string{bitcoin.SecretUser: "alice", bitcoin.SecretPassword: "s3cret-enough"}}
	if err := w.env.Client.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	// Nothing the operator watches changes when the Secret appears (Secrets are not
	// watched): its periodic look picks it up.
	actx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := ipc.Await(actx, w.env.Client, n, ipc.Ready); err != nil {
		t.Fatalf("with its secret: %v", err)
	}
}

// An image the simulated nodes cannot run is reported in the network's status.
func TestReportsPodsThatCannotRun(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	n := w.network("elsewhere", 1)
	n.Spec.Image = "example.com/not/bitcoind:1"
	if err := w.env.Client.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	w.waitNotReady(t, n, "ImageNotSimulated")
}

// A network with spec.storage gets a claim template instead of an emptyDir (so the
// StatefulSet controller makes data-<network>-<n>), and the storage cannot be dropped or
// changed afterwards: a StatefulSet's claim templates are fixed.
func TestStorageIsAClaimTemplate(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	n := w.network("kept", 1)
	n.Spec.Image = "example.com/not/bitcoind:1" // the StatefulSet is what is looked at
	class := "fast"
	n.Spec.Storage = &bitcoinv1alpha1.BitcoinStorage{StorageClassName: &class, Size: resource.MustParse("64Mi")}
	sts := w.createForStatefulSet(t, n)
	if len(sts.Spec.VolumeClaimTemplates) != 1 {
		t.Fatalf("claim templates %+v, want one named data", sts.Spec.VolumeClaimTemplates)
	}
	tmpl := sts.Spec.VolumeClaimTemplates[0]
	if tmpl.Name != "data" || tmpl.Spec.StorageClassName == nil || *tmpl.Spec.StorageClassName != class ||
		!tmpl.Spec.Resources.Requests.Storage().Equal(resource.MustParse("64Mi")) {
		t.Fatalf("claim template %+v, want data of class %s, 64Mi", tmpl, class)
	}
	for _, v := range sts.Spec.Template.Spec.Volumes {
		if v.Name == "data" {
			t.Fatalf("pod template still has volume data (%+v): the claim template must provide it", v)
		}
	}
	// A merge patch, not an update: the operator writes status meanwhile.
	base := n.DeepCopy()
	n.Spec.Storage = nil
	if err := w.env.Client.Patch(ctx, n, client.MergeFrom(base)); err == nil || !strings.Contains(err.Error(), "storage cannot be added or removed") {
		t.Fatalf("dropping spec.storage: got %v, want refused", err)
	}
}

// The network's trace goes on its StatefulSet, as the request's, and not on the pod
// template: a template that changed with each trace would roll the pods.
func TestStatefulSetCarriesTheNetworksTrace(t *testing.T) {
	w := newWorld(t)
	n := w.network("traced", 1)
	n.Spec.Image = "example.com/not/bitcoind:1" // the StatefulSet is what is looked at
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	n.Annotations = map[string]string{ipc.TraceParentAnnotation: traceparent}
	sts := w.createForStatefulSet(t, n)
	if got := sts.Annotations[ipc.TraceParentAnnotation]; got != traceparent {
		t.Errorf("statefulset traceparent %q, want the network's %q", got, traceparent)
	}
	if _, ok := sts.Spec.Template.Annotations[ipc.TraceParentAnnotation]; ok {
		t.Errorf("pod template carries a traceparent: %v", sts.Spec.Template.Annotations)
	}
}

// createForStatefulSet creates n and returns the StatefulSet the operator makes for it.
func (w *world) createForStatefulSet(t *testing.T, n *bitcoinv1alpha1.BitcoinNetwork) *appsv1.StatefulSet {
	t.Helper()
	if err := w.env.Client.Create(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	var sts appsv1.StatefulSet
	testenv.Eventually(t, 30*time.Second, "the statefulset", func(ctx context.Context) (bool, error) {
		err := w.env.Client.Get(ctx, client.ObjectKeyFromObject(n), &sts)
		return err == nil, err
	})
	return &sts
}
