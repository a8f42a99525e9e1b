package operator_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/storage/agent"
	"github.com/crdipc/crdipc/internal/storage/operator"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/ipc"
)

// The operator and the agents run as their ServiceAccounts, with only the permissions in
// config/rbac, through a volume's whole life, with leader election and heartbeats on.
func TestWithShippedRBAC(t *testing.T) {
	c := newCluster(t)
	opCfg := c.env.AsServiceAccount(t, "storage-operator")

	mgr := testenv.NewManager(t, opCfg, func(o *ctrl.Options) {
		o.LeaderElection, o.LeaderElectionID = true, "storage-operator-rbac-test.crdipc.io"
		o.LeaderElectionNamespace, o.LeaderElectionReleaseOnCancel = install.SystemNamespace, true
	})
	if err := operator.Register(mgr, operator.Options{Receiver: ipc.Options{LeaseDuration: 3 * time.Second}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &proc{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("operator: %v", err)
		}
	}()
	c.mu.Lock()
	c.ops = append(c.ops, p)
	c.mu.Unlock()

	for i := 1; i <= 2; i++ {
		node := c.nodeName(i)
		c.addNode(node)
		// Each agent as its node's: the node restriction admits nothing else.
		a, err := agent.New(c.env.AsPoolAgent(t, node), agent.Options{Node: node, Root: c.agentRoot(node), Resync: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		actx, acancel := context.WithCancel(context.Background())
		ap := &proc{cancel: acancel, done: make(chan struct{}), agent: a}
		go func() {
			defer close(ap.done)
			if err := a.Run(actx); err != nil {
				t.Errorf("agent: %v", err)
			}
		}()
		c.mu.Lock()
		c.agents[node] = ap
		c.mu.Unlock()
	}

	claim := c.createClaim("rbac", nil)
	c.waitPools(claim.Name, 2)
	v := c.createVolume("vol", 2, mib)
	c.waitVolume("vol", 20*time.Second, "Healthy", volumeReady)
	c.checkReplicaFiles("vol", 2, mib)
	if err := c.c.Delete(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	if err := c.c.Delete(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "volume, claim and files gone", func(ctx context.Context) (bool, error) {
		verr := c.c.Get(ctx, client.ObjectKeyFromObject(v), &storagev1alpha1.CStorVolume{})
		cerr := c.c.Get(ctx, client.ObjectKeyFromObject(claim), &storagev1alpha1.StoragePoolClaim{})
		if files := c.replicaFiles(); !isNotFound(verr) || !isNotFound(cerr) || len(files) != 0 {
			return false, fmt.Errorf("volume: %v, claim: %v, files: %v", verr, cerr, files)
		}
		return true, nil
	})
}
