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
	listNodes := func(replicas ...*storagev1alpha1.CStorVolumeReplica) {
		t.Helper()
		vol := &storagev1alpha1.CStorVolume{}
		if err := a.c.Get(ctx, client.ObjectKeyFromObject(a.vol), vol); err != nil {
			t.Fatal(err)
		}
		vol.Status.Replicas = nil
		for _, r := range replicas {
			vol.Status.Replicas = append(vol.Status.Replicas, storagev1alpha1.VolumeReplicaStatus{
				Name: r.Name, Pool: r.Spec.Pool, Node: r.Spec.NodeName, Phase: storagev1alpha1.ReplicaPhaseHealthy})
		}
		if err := a.c.Status().Update(ctx, vol); err != nil {
			t.Fatal(err)
		}
	}
	listNodes(a.r)

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
	listNodes(a.r, b.r)
	b.ready("4Mi")
	got, err := os.ReadFile(b.r.Status.Location)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[1<<20:1<<20+len(data)], data) {
		t.Fatal("the rebuilt replica does not hold its peer's data")
	}
}
