package operator_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/storage/agent"
	"github.com/crdipc/crdipc/internal/storage/operator"
	"github.com/crdipc/crdipc/ipc"
)

// applyRBAC creates the objects of config/rbac/<name>, as `kubectl apply -k` would, and
// returns a config that acts as its ServiceAccount.
func applyRBAC(t *testing.T, c client.Client, cfg *rest.Config, name string) *rest.Config {
	t.Helper()
	dir := filepath.Join("..", "..", "..", "config", "rbac", name)
	for _, f := range []string{"service_account.yaml", "role.yaml", "role_binding.yaml"} {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				t.Fatalf("%s: %v", f, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			if err := c.Create(context.Background(), u); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("%s: creating %s %s: %v", f, u.GetKind(), u.GetName(), err)
			}
		}
	}
	cfg = rest.CopyConfig(cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + install.SystemNamespace + ":crdipc-" + name}
	return cfg
}

// The operator and the agents run as their ServiceAccounts, with only the permissions in
// config/rbac, through a volume's whole life, with leader election and heartbeats on.
func TestWithShippedRBAC(t *testing.T) {
	c := newCluster(t)
	opCfg := applyRBAC(t, c.c, c.env.Config, "storage-operator")
	agentCfg := applyRBAC(t, c.c, c.env.Config, "pool-agent")

	mgr, err := ctrl.NewManager(opCfg, ctrl.Options{
		Scheme:                        scheme.Scheme,
		Metrics:                       metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:        "0",
		LeaderElection:                true,
		LeaderElectionID:              "storage-operator-rbac-test.crdipc.io",
		LeaderElectionNamespace:       install.SystemNamespace,
		LeaderElectionReleaseOnCancel: true,
		Controller:                    config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
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
	c.op = p
	c.mu.Unlock()

	for i := 1; i <= 2; i++ {
		node := c.nodeName(i)
		c.addNode(node)
		a, err := agent.New(agentCfg, agent.Options{Node: node, Root: c.agentRoot(node), Resync: time.Second})
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
	c.waitVolume("vol", 20*time.Second, volumeReady)
	c.checkReplicaFiles("vol", 2, mib)
	if err := c.c.Delete(context.Background(), v); err != nil {
		t.Fatal(err)
	}
	if err := c.c.Delete(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	c.eventually("volume, claim and files gone", 20*time.Second, func(ctx context.Context) (bool, string, error) {
		verr := c.c.Get(ctx, client.ObjectKeyFromObject(v), &storagev1alpha1.CStorVolume{})
		cerr := c.c.Get(ctx, client.ObjectKeyFromObject(claim), &storagev1alpha1.StoragePoolClaim{})
		files := c.replicaFiles()
		return isNotFound(verr) && isNotFound(cerr) && len(files) == 0, fmt.Sprintf("volume: %v, claim: %v, files: %v", verr, cerr, files), nil
	})
}
