package agent

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/storage/backend"
)

// Unit tests of the handlers, with the fake client and a real file backend; the
// integration tests (internal/storage/operator) run them against the API server.

func fakeClient(objs ...client.Object) client.WithWatch {
	return fake.NewClientBuilder().WithScheme(scheme.Scheme).
		WithObjects(objs...).
		WithStatusSubresource(&storagev1alpha1.CStorPool{}, &storagev1alpha1.CStorVolumeReplica{}).
		WithIndex(&storagev1alpha1.CStorVolumeReplica{}, storagev1alpha1.FieldPool, func(o client.Object) []string {
			return []string{o.(*storagev1alpha1.CStorVolumeReplica).Spec.Pool}
		}).
		Build()
}

func fileBackends(f *backend.File) func(storagev1alpha1.Backend) (backend.Backend, error) {
	a := &Agent{o: Options{Node: "n1", Backends: map[storagev1alpha1.Backend]backend.Backend{storagev1alpha1.BackendFile: f}}}
	return a.backend
}

func newTestPool() *storagev1alpha1.CStorPool {
	return &storagev1alpha1.CStorPool{
		ObjectMeta: metav1.ObjectMeta{Name: "claim-n1", Generation: 1},
		Spec:       storagev1alpha1.CStorPoolSpec{NodeName: "n1", Claim: "claim", Capacity: resource.MustParse("1Gi"), Backend: storagev1alpha1.BackendFile},
	}
}

func TestPoolCreatedThenImportedNeverRecreated(t *testing.T) {
	ctx := context.Background()
	f := backend.NewFile(t.TempDir())
	c := fakeClient()
	h := &poolHandler{node: "n1", c: c, live: c, backends: fileBackends(f), resync: time.Second}
	pool := newTestPool()

	res, err := h.Handle(ctx, pool)
	if err != nil || !res.Ready || res.RequeueAfter != time.Second {
		t.Fatalf("create: %+v %v", res, err)
	}
	if pool.Status.Phase != storagev1alpha1.PoolPhaseHealthy || pool.Status.Capacity.Total.String() != "1Gi" {
		t.Fatalf("after create: %+v", pool.Status)
	}
	dir := f.PoolDir(pool.Name)
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}

	// Killed after creating, before recording it: still Init; the directory is adopted.
	pool.Status.Phase = storagev1alpha1.PoolPhaseInit
	if res, err := h.Handle(ctx, pool); err != nil || !res.Ready {
		t.Fatalf("adopt: %+v %v", res, err)
	}

	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	res, err = h.Handle(ctx, pool)
	if err != nil || res.Ready || res.Reason != conditions.ReasonDegraded || !strings.Contains(res.Message, "not re-creating") {
		t.Fatalf("vanished pool: %+v %v", res, err)
	}
	if pool.Status.Phase != storagev1alpha1.PoolPhaseOffline {
		t.Fatalf("vanished pool is %s", pool.Status.Phase)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the pool directory was re-created: %v", err)
	}
}

func TestPoolOfUnavailableBackendFails(t *testing.T) {
	c := fakeClient()
	h := &poolHandler{node: "n1", c: c, live: c, backends: fileBackends(backend.NewFile(t.TempDir())), resync: time.Second}
	pool := newTestPool()
	pool.Spec.Backend = storagev1alpha1.BackendZFS
	if _, err := h.Handle(context.Background(), pool); err == nil || !strings.Contains(err.Error(), "not available") {
		t.Fatalf("zfs pool without zfs: %v", err)
	}
	if pool.Status.Phase != storagev1alpha1.PoolPhaseCreationFailed {
		t.Fatalf("phase %s", pool.Status.Phase)
	}
}

func TestPoolDeletionWaitsForReplicas(t *testing.T) {
	ctx := context.Background()
	f := backend.NewFile(t.TempDir())
	pool := newTestPool()
	replica := &storagev1alpha1.CStorVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vol-claim-n1"},
		Spec:       storagev1alpha1.CStorVolumeReplicaSpec{Volume: "vol", Pool: pool.Name, NodeName: "n1", Capacity: resource.MustParse("1Mi")},
	}
	c := fakeClient(pool, replica)
	h := &poolHandler{node: "n1", c: c, live: c, backends: fileBackends(f), resync: time.Second}
	if _, err := h.Handle(ctx, pool); err != nil {
		t.Fatal(err)
	}
	err := h.Finalize(ctx, pool)
	if err == nil || !strings.Contains(err.Error(), "ns/vol-claim-n1") {
		t.Fatalf("finalizing a pool with a replica: %v", err)
	}
	if _, err := os.Stat(f.PoolDir(pool.Name)); err != nil {
		t.Fatalf("held pool's directory: %v", err)
	}
	if err := c.Delete(ctx, replica); err != nil {
		t.Fatal(err)
	}
	if err := h.Finalize(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.PoolDir(pool.Name)); !os.IsNotExist(err) {
		t.Fatalf("empty pool's directory: %v", err)
	}
	if err := h.Finalize(ctx, pool); err != nil {
		t.Fatalf("finalizing again: %v", err)
	}
}
