package operator_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/scheme"
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

// The data-path CA key signs every node's identity: the node-side identities (the pool
// agent, the CSI node plugin and driver) may read the published CA certificate but not the
// Secret holding the key; the operator may.
func TestOnlyTheOperatorReadsTheDataCAKey(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	for _, o := range []client.Object{
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: storagev1alpha1.DataCASecret}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: storagev1alpha1.DataCAConfigMap}},
	} {
		if err := env.Client.Create(ctx, o); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}
	as := func(cfg *rest.Config) client.Client {
		c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	secret := client.ObjectKey{Namespace: install.SystemNamespace, Name: storagev1alpha1.DataCASecret}
	published := client.ObjectKey{Namespace: install.SystemNamespace, Name: storagev1alpha1.DataCAConfigMap}
	for name, cfg := range map[string]*rest.Config{
		"pool-agent": env.AsPoolAgent(t, "node-x"),
		"csi-node":   env.AsServiceAccount(t, "csi-node"),
		"csi-driver": env.AsServiceAccount(t, "csi-driver"),
	} {
		c := as(cfg)
		if err := c.Get(ctx, secret, &corev1.Secret{}); !apierrors.IsForbidden(err) {
			t.Errorf("%s getting the data CA Secret: %v, want Forbidden", name, err)
		}
		if err := c.Get(ctx, published, &corev1.ConfigMap{}); err != nil {
			t.Errorf("%s getting the published CA certificate: %v", name, err)
		}
	}
	if err := as(env.AsServiceAccount(t, "storage-operator")).Get(ctx, secret, &corev1.Secret{}); err != nil {
		t.Errorf("storage-operator getting the data CA Secret: %v", err)
	}
}
