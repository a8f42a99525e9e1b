package agent

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/backend"
)

func newTestReplica() *storagev1alpha1.CStorVolumeReplica {
	return &storagev1alpha1.CStorVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vol-claim-n1", Generation: 1},
		Spec:       storagev1alpha1.CStorVolumeReplicaSpec{Volume: "vol", Pool: "claim-n1", NodeName: "n1", Capacity: resource.MustParse("4Mi")},
	}
}

func TestReplicaWaitsForItsPool(t *testing.T) {
	ctx := context.Background()
	f := backend.NewFile(t.TempDir())
	r := newTestReplica()

	h := &replicaHandler{node: "n1", c: fakeClient(), backends: fileBackends(f), resync: time.Second}
	res, err := h.Handle(ctx, r)
	if err != nil || res.Reason != conditions.ReasonWaiting || r.Status.Phase != storagev1alpha1.ReplicaPhaseInit {
		t.Fatalf("no pool: %+v %v phase %s", res, err, r.Status.Phase)
	}

	pool := newTestPool()
	pool.Status.Phase = storagev1alpha1.PoolPhaseInit
	h.c = fakeClient(pool)
	res, err = h.Handle(ctx, r)
	if err != nil || res.Reason != conditions.ReasonWaiting || !strings.Contains(res.Message, "it is Init") {
		t.Fatalf("pool in Init: %+v %v", res, err)
	}
	if _, err := os.Stat(f.ReplicaPath(pool.Name, backendReplica(r))); !os.IsNotExist(err) {
		t.Fatalf("replica file before its pool is Healthy: %v", err)
	}
}

func TestReplicaCreatedThenStatNeverRecreated(t *testing.T) {
	ctx := context.Background()
	f := backend.NewFile(t.TempDir())
	pool := newTestPool()
	pool.Status.Phase = storagev1alpha1.PoolPhaseHealthy
	if _, err := f.CreatePool(ctx, backendPool(pool)); err != nil {
		t.Fatal(err)
	}
	h := &replicaHandler{node: "n1", c: fakeClient(pool), backends: fileBackends(f), resync: time.Second}
	r := newTestReplica()

	res, err := h.Handle(ctx, r)
	if err != nil || !res.Ready || r.Status.Phase != storagev1alpha1.ReplicaPhaseHealthy {
		t.Fatalf("create: %+v %v %s", res, err, r.Status.Phase)
	}
	path := f.ReplicaPath(pool.Name, backendReplica(r))
	if fi, err := os.Stat(path); err != nil || fi.Size() != 4<<20 {
		t.Fatalf("replica file: %v %v", fi, err)
	}
	if r.Status.Capacity.Total.String() != "4Mi" {
		t.Fatalf("capacity %+v", r.Status.Capacity)
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	res, err = h.Handle(ctx, r)
	if err != nil || res.Reason != conditions.ReasonDegraded || r.Status.Phase != storagev1alpha1.ReplicaPhaseOffline {
		t.Fatalf("vanished replica: %+v %v %s", res, err, r.Status.Phase)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("the replica file was re-created")
	}
}

func TestReplicaFinalize(t *testing.T) {
	ctx := context.Background()
	f := backend.NewFile(t.TempDir())
	pool := newTestPool()
	pool.Status.Phase = storagev1alpha1.PoolPhaseHealthy
	if _, err := f.CreatePool(ctx, backendPool(pool)); err != nil {
		t.Fatal(err)
	}
	h := &replicaHandler{node: "n1", c: fakeClient(pool), backends: fileBackends(f), resync: time.Second}
	r := newTestReplica()
	if _, err := h.Handle(ctx, r); err != nil {
		t.Fatal(err)
	}
	for range 2 { // idempotent: the second finds nothing to delete
		if err := h.Finalize(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(f.ReplicaPath(pool.Name, backendReplica(r))); !os.IsNotExist(err) {
		t.Fatalf("replica file after finalize: %v", err)
	}
	h.c = fakeClient() // the pool is gone: so is the data
	if err := h.Finalize(ctx, r); err != nil {
		t.Fatal(err)
	}
}
