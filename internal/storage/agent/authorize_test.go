package agent

import (
	"errors"
	"testing"

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
}
