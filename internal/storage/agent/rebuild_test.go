package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/api/conditions"
	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/dataca"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// A replica placed on a new node is refused by its peers' data services until the volume's
// status lists that node (the operator writes it after creating the replica). Meanwhile
// its agent cannot tell whether the new, empty file is current: it must not call it
// Healthy, or the volume counts an empty file as a copy of its data. Once the node is
// listed, the new replica is rebuilt from its peer and holds the peer's data.
func TestNewReplicaWaitsForPeersThatRefuseIt(t *testing.T) {
	ctx := t.Context()
	a := startAgent(t, "holder", "1Gi", "4Mi")
	a.ready("4Mi")

	// What a target wrote and closed cleanly.
	data := bytes.Repeat([]byte("crdipc-rebuild "), 4096)
	session := a.dial(t)
	if _, err := session.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := session.WriteAt(ctx, data, 1<<20, 1); err != nil {
		t.Fatal(err)
	}
	if err := session.CloseSession(ctx); err != nil {
		t.Fatal(err)
	}
	listReplicas(t, a.c, a.vol, a.r)

	// The new replica's node is not listed yet: the holder refuses it.
	b := startAgentFor(t, a.ca, a.vol, "joiner", "1Gi")
	wait.Eventually(t, 60*time.Second, "the new replica waiting for its peer", func(ctx context.Context) (bool, error) {
		if err := b.c.Get(ctx, client.ObjectKeyFromObject(b.r), b.r); err != nil {
			return false, err
		}
		if b.r.Status.Phase == storagev1alpha1.ReplicaPhaseHealthy {
			t.Fatalf("the new replica is Healthy while its peer refuses it: %+v", b.r.Status)
		}
		cond := meta.FindStatusCondition(b.r.Status.Conditions, conditions.TypeReady)
		if cond == nil || !strings.Contains(cond.Message, "cannot tell whether the replica is current") || !strings.Contains(cond.Message, a.r.Name) {
			return false, fmt.Errorf("status %+v", b.r.Status)
		}
		return true, nil
	})
	if b.r.Status.Phase != storagev1alpha1.ReplicaPhaseRebuilding {
		t.Fatalf("the new replica waiting for its peer is %s, want Rebuilding", b.r.Status.Phase)
	}
	t.Logf("waiting: %s", meta.FindStatusCondition(b.r.Status.Conditions, conditions.TypeReady).Message)

	// Listed: rebuilt from the holder.
	listReplicas(t, a.c, a.vol, a.r, b.r)
	b.ready("4Mi")
	holds(t, b.r, 1<<20, data)
}

// A replica whose target died stays dirty (it may hold writes that were never
// acknowledged). A new replica placed while no target writes the volume copies it, the
// freshest copy there is, rather than count as a copy of the volume while it holds
// nothing until a target next opens the volume.
func TestNewReplicaCopiesADirtyPeer(t *testing.T) {
	ctx := t.Context()
	a := startAgent(t, "dirty", "1Gi", "4Mi")
	a.ready("4Mi")

	// A target writes, then its connection drops without CloseSession: the session ends,
	// the replica stays dirty.
	data := bytes.Repeat([]byte("crdipc-dirty "), 4096)
	conn := a.connAs(t, dataca.CommonName(dataca.RoleCSINode, "test-node"))
	session := conn.Replica(storagev1alpha1.ReplicaDataID(a.r.Namespace, a.r.Name))
	if _, err := session.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := session.WriteAt(ctx, data, 2<<20, 1); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	probe := a.dial(t)
	wait.Eventually(t, 30*time.Second, "the holder dirty with no writer", func(ctx context.Context) (bool, error) {
		in, err := probe.Info(ctx)
		if err != nil || in.Session || !in.Dirty || in.Revision != 1 {
			return false, fmt.Errorf("info %+v, %v", in, err)
		}
		return true, nil
	})

	b := startAgentFor(t, a.ca, a.vol, "joiner", "1Gi")
	listReplicas(t, a.c, a.vol, a.r, b.r)
	b.ready("4Mi")
	if b.r.Status.Revision != 1 {
		t.Fatalf("the new replica is at revision %d, want its source's 1", b.r.Status.Revision)
	}
	holds(t, b.r, 2<<20, data)
}

// listReplicas writes vol's status as the operator would with replicas on their nodes,
// all Healthy: a replica's data service serves the agents of the nodes listed.
func listReplicas(t *testing.T, c client.Client, vol *storagev1alpha1.CStorVolume, replicas ...*storagev1alpha1.CStorVolumeReplica) {
	t.Helper()
	latest := &storagev1alpha1.CStorVolume{}
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(vol), latest); err != nil {
		t.Fatal(err)
	}
	latest.Status.Replicas = nil
	for _, r := range replicas {
		latest.Status.Replicas = append(latest.Status.Replicas, storagev1alpha1.VolumeReplicaStatus{
			Name: r.Name, Pool: r.Spec.Pool, Node: r.Spec.NodeName, Phase: storagev1alpha1.ReplicaPhaseHealthy})
	}
	if err := c.Status().Update(t.Context(), latest); err != nil {
		t.Fatal(err)
	}
}

// holds fails t unless replica r's file holds data at off.
func holds(t *testing.T, r *storagev1alpha1.CStorVolumeReplica, off int, data []byte) {
	t.Helper()
	got, err := os.ReadFile(r.Status.Location)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < off+len(data) || !bytes.Equal(got[off:off+len(data)], data) {
		t.Fatalf("replica %s does not hold its peer's data", r.Name)
	}
}
