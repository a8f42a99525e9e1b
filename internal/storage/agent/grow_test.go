package agent

import (
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/storage/dataca"
	"github.com/crdipc/crdipc/internal/storage/replica"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// A replica whose spec.capacity grows is grown on disk, its data service serves the new size
// to the writer session that was open all along, and status.capacity.total reports it. A
// growth the pool has no room for is refused with a message saying so, and nothing shrinks.
func TestReplicaGrowsWithItsSpec(t *testing.T) {
	const mi = 1 << 20
	ctx := t.Context()
	a := startAgent(t, "grow", "1Gi", "4Mi")
	c, r, pool := a.c, a.r, a.pool
	ready := a.ready
	ready("4Mi")
	path := r.Status.Location

	// A target's writer session, open across the growth.
	session := a.dial(t)
	if in, err := session.Open(ctx); err != nil || in.Size != 4*mi {
		t.Fatalf("open: %+v, %v", in, err)
	}
	before := bytes.Repeat([]byte{0xB0}, 64<<10)
	if err := session.WriteAt(ctx, before, 4*mi-int64(len(before)), 1); err != nil {
		t.Fatal(err)
	}

	patchCapacity := func(q string) {
		t.Helper()
		patch := fmt.Sprintf(`{"spec":{"capacity":%q}}`, q)
		if err := c.Patch(ctx, r, client.RawPatch("application/merge-patch+json", []byte(patch))); err != nil {
			t.Fatalf("raising spec.capacity to %s: %v", q, err)
		}
	}
	patchCapacity("12Mi")
	ready("12Mi")
	if fi, err := os.Stat(path); err != nil || fi.Size() != 12*mi {
		t.Fatalf("replica file after growth: %v, %v", fi, err)
	}
	in, err := session.Info(ctx)
	if err != nil || in.Size != 12*mi || !in.Session {
		t.Fatalf("info in the session opened before the growth: %+v, %v", in, err)
	}
	after := bytes.Repeat([]byte{0xA1}, 64<<10)
	if err := session.WriteAt(ctx, after, 12*mi-int64(len(after)), 2); err != nil {
		t.Fatalf("write up to the new end: %v", err)
	}
	for off, want := range map[int64][]byte{4*mi - int64(len(before)): before, 12*mi - int64(len(after)): after} {
		got := make([]byte, len(want))
		if err := session.ReadAt(ctx, got, off); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("read at %d: %v (equal %v)", off, err, bytes.Equal(got, want))
		}
	}

	// More than the 1Gi pool holds: refused, said so, retried; the replica keeps serving.
	patchCapacity("2Gi")
	wait.Eventually(t, 60*time.Second, "growth past the pool refused", func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(r), r); err != nil {
			return false, err
		}
		cond := meta.FindStatusCondition(r.Status.Conditions, conditions.TypeReady)
		if cond == nil || r.Status.ObservedGeneration != r.Generation || cond.Reason != ReasonResizing {
			return false, fmt.Errorf("generation %d, status %+v", r.Generation, r.Status)
		}
		if !strings.Contains(cond.Message, "not enough space in the pool") || !strings.Contains(cond.Message, pool.Name) {
			return false, fmt.Errorf("message %q does not say the pool has no room", cond.Message)
		}
		return true, nil
	})
	if r.Status.Phase != storagev1alpha1.ReplicaPhaseHealthy || r.Status.Capacity.Total.String() != "12Mi" {
		t.Fatalf("after a refused growth: phase %s, capacity %+v", r.Status.Phase, r.Status.Capacity)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() != 12*mi {
		t.Fatalf("replica file after a refused growth: %v, %v", fi, err)
	}
	if in, err := session.Info(ctx); err != nil || in.Size != 12*mi {
		t.Fatalf("info after a refused growth: %+v, %v", in, err)
	}
	if err := session.CloseSession(ctx); err != nil {
		t.Fatal(err)
	}
}

// agentAndReplica is a pool agent running on a node of its own with one pool and one
// replica on it, for the tests of this package that need a real data service.
type agentAndReplica struct {
	c    client.Client
	ca   replica.CA
	vol  *storagev1alpha1.CStorVolume
	pool *storagev1alpha1.CStorPool
	r    *storagev1alpha1.CStorVolumeReplica
	// ready waits until the agent reports r at its current generation with capacity total.
	ready func(total string)
	// restart stops the agent and starts another for the node, on the same files, with
	// its options changed by the functions given.
	restart func(...func(*Options))
	// readyz is the running agent's readiness (Agent.Ready).
	readyz func() error
}

// startAgent creates a volume "vol" of size in a namespace of its own, a pool of poolSize
// and a replica of the volume on node <prefix>-<namespace>, and runs an agent for that
// node, stopped and the objects deleted with the test.
func startAgent(t *testing.T, prefix, poolSize, size string) *agentAndReplica {
	t.Helper()
	env := testenv.Get(t)
	ca, err := dataca.Ensure(t.Context(), env.Client, env.Client, install.SystemNamespace)
	if err != nil {
		t.Fatal(err)
	}
	if err := dataca.Publish(t.Context(), env.Client, env.Client, install.SystemNamespace, ca); err != nil {
		t.Fatal(err)
	}
	signRequests(t, ca)
	vol := &storagev1alpha1.CStorVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: env.Namespace(t), Name: "vol"},
		Spec:       storagev1alpha1.CStorVolumeSpec{Capacity: resource.MustParse(size)},
	}
	if err := env.Client.Create(t.Context(), vol); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), vol) }) // no operator here: no finalizer
	return startAgentFor(t, ca, vol, prefix, poolSize)
}

// startAgentFor is startAgent for another replica of vol, on node <prefix>-<namespace>;
// ca is the data CA whose requests the test signs.
func startAgentFor(t *testing.T, ca replica.CA, vol *storagev1alpha1.CStorVolume, prefix, poolSize string, opts ...func(*Options)) *agentAndReplica {
	t.Helper()
	env := testenv.Get(t)
	ns, size := vol.Namespace, vol.Spec.Capacity.String()
	ctx := t.Context()
	c := env.Client
	node := prefix + "-" + ns
	pool := &storagev1alpha1.CStorPool{
		ObjectMeta: metav1.ObjectMeta{Name: "claim-" + node},
		Spec:       storagev1alpha1.CStorPoolSpec{NodeName: node, Claim: "claim", Capacity: resource.MustParse(poolSize), Backend: storagev1alpha1.BackendFile},
	}
	r := &storagev1alpha1.CStorVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: vol.Name + "-" + pool.Name},
		Spec:       storagev1alpha1.CStorVolumeReplicaSpec{Volume: vol.Name, Pool: pool.Name, NodeName: node, Capacity: resource.MustParse(size)},
	}
	for _, o := range []client.Object{pool, r} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// The agent is stopped by then: release its finalizers so the objects go.
		bg := context.Background()
		for _, o := range []client.Object{r, pool} {
			_ = c.Patch(bg, o, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`)))
			_ = c.Delete(bg, o)
		}
	})
	o := Options{
		Node: node, Root: t.TempDir(), Resync: 300 * time.Millisecond, DataAddr: "127.0.0.1:0",
		LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 100 * time.Millisecond,
	}
	var (
		ag   *Agent
		stop func()
	)
	run := func(opts ...func(*Options)) {
		o := o
		for _, f := range opts {
			f(&o)
		}
		var err error
		if ag, err = New(env.Config, o); err != nil {
			t.Fatal(err)
		}
		actx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func(ag *Agent) { done <- ag.Run(actx) }(ag)
		stop = sync.OnceFunc(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent: %v", err)
			}
		})
	}
	run(opts...)
	t.Cleanup(func() { stop() })
	return &agentAndReplica{c: c, ca: ca, vol: vol, pool: pool, r: r,
		restart: func(opts ...func(*Options)) { stop(); run(opts...) },
		readyz:  func() error { return ag.Ready(httptest.NewRequestWithContext(t.Context(), "GET", "/readyz", nil)) },
		ready: func(total string) {
			t.Helper()
			wait.Eventually(t, 60*time.Second, "replica Ready with capacity "+total, func(ctx context.Context) (bool, error) {
				if err := c.Get(ctx, client.ObjectKeyFromObject(r), r); err != nil {
					return false, err
				}
				cond := meta.FindStatusCondition(r.Status.Conditions, conditions.TypeReady)
				if cond == nil || cond.Status != metav1.ConditionTrue || r.Status.ObservedGeneration != r.Generation ||
					r.Status.Capacity == nil || r.Status.Capacity.Total.String() != total {
					return false, fmt.Errorf("generation %d, status %+v", r.Generation, r.Status)
				}
				return true, nil
			})
		}}
}

// signRequests stands in for the storage operator, which this package cannot import: it
// approves and signs every data-path certificate request until the test ends.
func signRequests(t *testing.T, ca replica.CA) {
	t.Helper()
	kube, err := kubernetes.NewForConfig(testenv.Get(t).Config)
	if err != nil {
		t.Fatal(err)
	}
	csrs := kube.CertificatesV1().CertificateSigningRequests()
	sign := func(ctx context.Context) error {
		w, err := csrs.Watch(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		defer w.Stop()
		for ev := range w.ResultChan() {
			req, ok := ev.Object.(*certificatesv1.CertificateSigningRequest)
			if !ok || req.Spec.SignerName != storagev1alpha1.DataSigner || len(req.Status.Certificate) > 0 || len(req.Status.Conditions) > 0 {
				continue
			}
			req.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test"}}
			if req, err = csrs.UpdateApproval(ctx, req.Name, req, metav1.UpdateOptions{}); err != nil {
				return client.IgnoreNotFound(err)
			}
			if req.Status.Certificate, err = dataca.Sign(ca, req.Spec, time.Now()); err != nil {
				return err
			}
			if _, err := csrs.UpdateStatus(ctx, req, metav1.UpdateOptions{}); err != nil {
				return client.IgnoreNotFound(err)
			}
		}
		return nil
	}
	testenv.Start(t, "data-path signer", func(ctx context.Context) error {
		// A watch may end before the test does: watch again.
		for ctx.Err() == nil {
			if err := sign(ctx); err != nil && ctx.Err() == nil {
				return err
			}
		}
		return nil
	})
}

// dial connects to the replica's data service as a target would (closed with the test).
func (a *agentAndReplica) dial(t *testing.T) *replica.Client {
	t.Helper()
	return a.dialAs(t, dataca.CommonName(dataca.RoleCSINode, "test-node"))
}

// dialAs is dial with a certificate for common name cn, from the data CA.
func (a *agentAndReplica) dialAs(t *testing.T, cn string) *replica.Client {
	t.Helper()
	return a.connAs(t, cn).Replica(storagev1alpha1.ReplicaDataID(a.r.Namespace, a.r.Name))
}

// connAs connects to the replica's data service with a certificate for common name cn, from
// the data CA (closed with the test).
func (a *agentAndReplica) connAs(t *testing.T, cn string) *replica.Conn {
	t.Helper()
	_, clientTLS, err := dataca.Issue(a.ca, cn)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := replica.Dial(t.Context(), a.r.Status.Endpoint, clientTLS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
