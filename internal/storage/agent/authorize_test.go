package agent

import (
	"context"
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/dataca"
	"github.com/crdipc/crdipc/internal/storage/replica"
)

// A node's replica data service serves a replica only to its volume's members: the agents of
// the nodes holding its replicas, and the CSI node service of the node the volume is
// published to. Other holders of a data-path certificate are refused, and so is a
// certificate that names no node.
func TestDataServiceRefusesNonMembers(t *testing.T) {
	a := startAgent(t, "members", "1Gi", "4Mi")
	a.ready("4Mi")
	ctx := t.Context()
	node := a.r.Spec.NodeName

	// The volume's replicas: this node's and one on node "peer".
	a.vol.Status.Replicas = []storagev1alpha1.VolumeReplicaStatus{
		{Name: a.r.Name, Pool: a.pool.Name, Node: node},
		{Name: "vol-peer", Pool: "claim-peer", Node: "peer"},
	}
	if err := a.c.Status().Update(ctx, a.vol); err != nil {
		t.Fatal(err)
	}
	patch := []byte(`{"metadata":{"annotations":{"` + storagev1alpha1.AnnotationPublished + `":"{\"target-node\":\"rw\"}"}}}`)
	if err := a.c.Patch(ctx, a.vol, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatal(err)
	}

	for cn, want := range map[string]error{
		dataca.CommonName(dataca.RoleNode, "peer"):           nil,
		dataca.CommonName(dataca.RoleNode, node):             nil,
		dataca.CommonName(dataca.RoleCSINode, "target-node"): nil,
		dataca.CommonName(dataca.RoleNode, "stranger"):       replica.ErrForbidden,
		dataca.CommonName(dataca.RoleCSINode, "peer"):        replica.ErrForbidden,
		dataca.CommonName(dataca.RoleCSINode, "stranger"):    replica.ErrForbidden,
		"test-target": replica.ErrForbidden,
	} {
		_, err := a.dialAs(t, cn).Info(ctx)
		if (want == nil && err != nil) || (want != nil && !errors.Is(err, want)) {
			t.Errorf("%s: %v, want %v", cn, err, want)
		} else if err != nil {
			t.Logf("%s refused: %v", cn, err)
		}
	}

	// A snapshot of the replica is read, too, by the agent of a node whose replica of
	// another volume is restored from it; not by other nodes.
	snap := &storagev1alpha1.CStorVolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: a.r.Namespace, Name: "snap"},
		Spec:       storagev1alpha1.CStorVolumeSnapshotSpec{Volume: a.vol.Name},
	}
	restored := &storagev1alpha1.CStorVolumeReplica{
		ObjectMeta: metav1.ObjectMeta{Namespace: a.r.Namespace, Name: "restored-on-restorer"},
		Spec: storagev1alpha1.CStorVolumeReplicaSpec{Volume: "restored", Pool: "claim-restorer", NodeName: "restorer",
			Capacity: resource.MustParse("4Mi"), Source: &storagev1alpha1.ReplicaSource{Snapshot: snap.Name}},
	}
	for _, o := range []client.Object{snap, restored} {
		if err := a.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.c.Delete(context.Background(), o) })
	}
	id := storagev1alpha1.SnapshotDataID(a.r.Namespace, a.r.Name, string(snap.UID))
	// The snapshot was never taken: a reader that may read it finds none.
	if _, err := a.connAs(t, dataca.CommonName(dataca.RoleNode, "restorer")).Replica(id).Info(ctx); !errors.Is(err, replica.ErrNotFound) {
		t.Errorf("the restoring node reading the snapshot: %v, want ErrNotFound", err)
	}
	if _, err := a.connAs(t, dataca.CommonName(dataca.RoleNode, "stranger")).Replica(id).Info(ctx); !errors.Is(err, replica.ErrForbidden) {
		t.Errorf("another node reading the snapshot: %v, want ErrForbidden", err)
	}
}
