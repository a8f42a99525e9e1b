package identity_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/config/rbac"
	"github.com/crdipc/crdipc/internal/identity"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// access is one question to the authorizer about a service's ServiceAccount.
type access struct {
	verb, group, resource, subresource, namespace, name string
	allowed                                             bool
}

// TestShippedRolesAllowOnlyWhatEachServiceNeeds asks the API server's authorizer
// (SubjectAccessReview), for each service's ServiceAccount as Apply installs it, what its
// work needs — allowed — and what lies outside its role — denied.
func TestShippedRolesAllowOnlyWhatEachServiceNeeds(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	services, err := rbac.Services()
	if err != nil {
		t.Fatal(err)
	}
	namespaces, err := identity.Apply(ctx, env.Config, services, identity.ApplyOptions{BindIn: map[string]string{"webhook-listener": "scm", "metrics-agent": "scm"}})
	if err != nil {
		t.Fatal(err)
	}
	const sys = "crdipc-system"
	cases := map[string][]access{
		"books": {
			{verb: "update", group: "library.crdipc.io", resource: "books", subresource: "status", namespace: "default", allowed: true},
			{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: sys, allowed: true},
			{verb: "create", resource: "pods", namespace: "default"},
			{verb: "get", resource: "secrets", namespace: sys},
			{verb: "update", group: "storage.crdipc.io", resource: "cstorvolumes", namespace: "default"},
			{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: "default"},
		},
		"storage-operator": {
			{verb: "create", group: "storage.crdipc.io", resource: "cstorvolumereplicas", namespace: "default", allowed: true},
			{verb: "create", group: "storage.crdipc.io", resource: "cstorpools", allowed: true},
			{verb: "delete", resource: "nodes"},
			{verb: "update", group: "library.crdipc.io", resource: "books", namespace: "default"},
			{verb: "create", group: "snapshot.storage.k8s.io", resource: "volumesnapshots", namespace: "default", allowed: true},
			{verb: "get", resource: "secrets", namespace: "crdipc-backup", allowed: true},
			{verb: "list", resource: "secrets", namespace: "crdipc-backup"},
		},
		"pool-agent": {
			{verb: "update", group: "storage.crdipc.io", resource: "cstorpools", subresource: "status", allowed: true},
			{verb: "create", group: "storage.crdipc.io", resource: "cstorpools"},
			{verb: "delete", group: "storage.crdipc.io", resource: "cstorvolumereplicas", namespace: "default"},
			{verb: "list", resource: "secrets", namespace: "default"},
			// The backup stores' Secrets, and no other.
			{verb: "get", resource: "secrets", namespace: "crdipc-backup", allowed: true},
			{verb: "get", resource: "secrets", namespace: sys},
			{verb: "patch", group: "storage.crdipc.io", resource: "volumebackups", subresource: "status", namespace: "default", allowed: true},
			{verb: "update", group: "storage.crdipc.io", resource: "volumebackups", namespace: "default"},
			{verb: "create", group: "storage.crdipc.io", resource: "volumebackups", namespace: "default"},
		},
		"csi-driver": {
			{verb: "create", group: "storage.crdipc.io", resource: "cstorvolumes", namespace: sys, allowed: true},
			{verb: "create", resource: "persistentvolumes"},
			{verb: "get", resource: "secrets", namespace: "default"},
		},
		"csi-node": {
			// Read-only: the node plugin stages volumes; the controller creates and deletes them.
			{verb: "get", group: "storage.crdipc.io", resource: "cstorvolumes", namespace: sys, allowed: true},
			{verb: "list", group: "storage.crdipc.io", resource: "cstorvolumes", namespace: sys, allowed: true},
			// It takes the snapshots of the volumes published to it, and reports them.
			{verb: "watch", group: "storage.crdipc.io", resource: "cstorvolumesnapshots", namespace: sys, allowed: true},
			{verb: "update", group: "storage.crdipc.io", resource: "cstorvolumesnapshots", subresource: "status", namespace: sys, allowed: true},
			{verb: "create", group: "storage.crdipc.io", resource: "cstorvolumesnapshots", namespace: sys},
			{verb: "delete", group: "storage.crdipc.io", resource: "cstorvolumesnapshots", namespace: sys},
			{verb: "create", group: "storage.crdipc.io", resource: "cstorvolumes", namespace: sys},
			{verb: "delete", group: "storage.crdipc.io", resource: "cstorvolumes", namespace: sys},
			{verb: "update", group: "storage.crdipc.io", resource: "cstorvolumes", namespace: sys},
			{verb: "get", group: "storage.crdipc.io", resource: "cstorvolumes", namespace: "default"},
			{verb: "list", resource: "secrets", namespace: sys},
		},
		"snapshot-controller": {
			{verb: "create", group: "snapshot.storage.k8s.io", resource: "volumesnapshotcontents", allowed: true},
			{verb: "patch", group: "snapshot.storage.k8s.io", resource: "volumesnapshots", subresource: "status", namespace: "default", allowed: true},
			{verb: "update", resource: "persistentvolumeclaims", namespace: "default", allowed: true},
			// Upstream's role less the group snapshots; never the volumes themselves.
			{verb: "list", group: "groupsnapshot.storage.k8s.io", resource: "volumegroupsnapshots", namespace: "default"},
			{verb: "delete", resource: "persistentvolumes"},
			{verb: "get", group: "storage.crdipc.io", resource: "cstorvolumes", namespace: sys},
		},
		"csi-sidecar": {
			{verb: "create", resource: "persistentvolumes", allowed: true},
			{verb: "create", group: "storage.crdipc.io", resource: "cstorvolumes", namespace: sys},
			{verb: "delete", resource: "pods", namespace: "default"},
		},
		"bitcoin-operator": {
			{verb: "create", group: "apps", resource: "statefulsets", namespace: "default", allowed: true},
			{verb: "create", group: "storage.crdipc.io", resource: "cstorpools"},
			{verb: "create", resource: "nodes"},
		},
		"webhook-listener": {
			{verb: "create", group: "scm.crdipc.io", resource: "pullrequests", namespace: "scm", allowed: true},
			{verb: "create", resource: "events", namespace: "scm", allowed: true},
			// Only where it is bound, and never delete.
			{verb: "create", group: "scm.crdipc.io", resource: "pullrequests", namespace: "default"},
			{verb: "delete", group: "scm.crdipc.io", resource: "pullrequests", namespace: "scm"},
			{verb: "list", resource: "secrets", namespace: "scm"},
		},
		"metrics-agent": {
			{verb: "watch", resource: "events", namespace: "scm", allowed: true},
			{verb: "list", group: "scm.crdipc.io", resource: "branches", namespace: "scm", allowed: true},
			{verb: "create", resource: "events", namespace: "scm"},
			{verb: "list", resource: "events", namespace: "default"},
			// Its checkpoint, and no other ConfigMap.
			{verb: "update", resource: "configmaps", namespace: "scm", name: "crdipc-metrics-agent-checkpoint", allowed: true},
			{verb: "create", resource: "configmaps", namespace: "scm", allowed: true},
			{verb: "update", resource: "configmaps", namespace: "scm", name: "other"},
			{verb: "get", resource: "configmaps", namespace: "default", name: "crdipc-metrics-agent-checkpoint"},
		},
		// The simulated nodes' watch, and the pool agents' supervisor: what a node writes
		// about itself and its pods goes as system:node:<name>, not as this account.
		"nodes": {
			{verb: "watch", resource: "pods", allowed: true},
			{verb: "list", resource: "nodes", allowed: true},
			{verb: "update", group: "storage.crdipc.io", resource: "cstorpools", subresource: "status", allowed: true},
			{verb: "create", resource: "nodes"},
			{verb: "update", resource: "nodes", subresource: "status"},
			{verb: "update", resource: "pods", subresource: "status", namespace: "default"},
			{verb: "delete", resource: "pods", namespace: "default"},
			{verb: "create", group: "coordination.k8s.io", resource: "leases", namespace: "kube-node-lease"},
			{verb: "get", resource: "secrets", namespace: "default"},
			{verb: "update", group: "storage.crdipc.io", resource: "cstorpools"},
		},
		// up's console reads what its page shows and writes nothing.
		"console": {
			{verb: "list", resource: "nodes", allowed: true},
			{verb: "watch", resource: "events", namespace: "scm", allowed: true},
			{verb: "list", group: "library.crdipc.io", resource: "books", allowed: true},
			{verb: "watch", group: "bitcoin.crdipc.io", resource: "bitcoinnetworks", namespace: "default", allowed: true},
			{verb: "create", group: "library.crdipc.io", resource: "books", namespace: "default"},
			{verb: "delete", resource: "pods", namespace: "default"},
			{verb: "update", group: "storage.crdipc.io", resource: "cstorpools"},
			{verb: "get", resource: "secrets", namespace: sys},
		},
	}
	for _, svc := range services {
		if cases[svc] == nil {
			t.Errorf("service %s ships RBAC but has no access cases here", svc)
		}
	}
	for svc, accesses := range cases {
		user := identity.Username(namespaces[svc], svc)
		for _, a := range accesses {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User:   user,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespaces[svc], "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{
					Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource, Namespace: a.namespace, Name: a.name,
				},
			}}
			got, err := env.Kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Status.Allowed != a.allowed {
				t.Errorf("%s may %s %s/%s %s %q in %q: %v, want %v (%s)", svc, a.verb, a.group, a.resource, a.subresource, a.name, a.namespace, got.Status.Allowed, a.allowed, got.Status.Reason)
			}
		}
	}
}

// TestKeeperConfigActsAsTheServiceAccount: the config and the kubeconfig a Keeper hands out
// authenticate as the ServiceAccount, with nothing of the admin's, and what its role does
// not allow is refused.
func TestKeeperConfigActsAsTheServiceAccount(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	namespaces, err := identity.Apply(ctx, env.Config, []string{"books"}, identity.ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	k, err := identity.NewKeeper(env.Config, dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := k.Config(ctx, namespaces["books"], identity.ServiceAccount("books"))
	if err != nil {
		t.Fatal(err)
	}
	fromFile, err := clientcmd.BuildConfigFromFlags("", k.Kubeconfig(namespaces["books"], identity.ServiceAccount("books")))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(filepath.Join(dir, namespaces["books"], "crdipc-books.token")); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("token file: %v, mode %v; want 0600", err, info.Mode().Perm())
	}
	for name, c := range map[string]*kubernetes.Clientset{"config": kubernetes.NewForConfigOrDie(cfg), "kubeconfig": kubernetes.NewForConfigOrDie(fromFile)} {
		who, err := c.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want := identity.Username(namespaces["books"], "books"); who.Status.UserInfo.Username != want {
			t.Errorf("%s authenticates as %q, want %q", name, who.Status.UserInfo.Username, want)
		}
		_, err = c.CoreV1().Secrets("crdipc-system").List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: listing Secrets: %v, want Forbidden", name, err)
		}
	}
}

// TestPoolAgentNodeRestriction: with a token bound to its node, the pool agent of node A may
// write A's pools and A's Lease, and is refused — with a message naming the policy — on
// node B's; without a node-bound token it may write none.
func TestPoolAgentNodeRestriction(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	namespaces, err := identity.Apply(ctx, env.Config, []string{"pool-agent"}, identity.ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns := namespaces["pool-agent"]
	nodes := []string{"restricted-a", "restricted-b"}
	for _, n := range nodes {
		if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
		pool := &storagev1alpha1.CStorPool{
			ObjectMeta: metav1.ObjectMeta{Name: "pool-" + n},
			Spec:       storagev1alpha1.CStorPoolSpec{NodeName: n, Claim: "claim", Capacity: resource.MustParse("1Gi")},
		}
		if err := env.Client.Create(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	k, err := identity.NewKeeper(env.Config, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	bound, err := k.NodeConfig(ctx, ns, identity.ServiceAccount("pool-agent"), nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	unbound, err := k.Config(ctx, ns, identity.ServiceAccount("pool-agent"))
	if err != nil {
		t.Fatal(err)
	}
	patchPool := func(cfg *rest.Config, node string) error {
		c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
		if err != nil {
			return err
		}
		pool := &storagev1alpha1.CStorPool{ObjectMeta: metav1.ObjectMeta{Name: "pool-" + node}}
		return c.Patch(ctx, pool, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"touched":"yes"}}}`)))
	}
	createLease := func(cfg *rest.Config, node string) error {
		kube := kubernetes.NewForConfigOrDie(cfg)
		_, err := kube.CoordinationV1().Leases(ns).Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: storagev1alpha1.NodeLeaseName(node)}}, metav1.CreateOptions{})
		return err
	}
	const policy = "crdipc-pool-agent-node-restriction"
	// The API server takes a moment to load a new policy.
	testenv.Eventually(t, 30*time.Second, "node B's pool refused to node A's agent", func(context.Context) (bool, error) {
		err := patchPool(bound, nodes[1])
		if err == nil || !strings.Contains(err.Error(), policy) || !strings.Contains(err.Error(), "may write only objects of its own node") {
			return false, fmt.Errorf("patching node B's pool: %v", err)
		}
		return true, nil
	})
	if err := patchPool(bound, nodes[0]); err != nil {
		t.Errorf("node A's agent patching node A's pool: %v", err)
	}
	if err := createLease(bound, nodes[1]); err == nil || !strings.Contains(err.Error(), "may write only its own node Lease") {
		t.Errorf("node A's agent creating node B's Lease: %v, want refused", err)
	}
	if err := createLease(bound, nodes[0]); err != nil {
		t.Errorf("node A's agent creating its own Lease: %v", err)
	}
	if err := patchPool(unbound, nodes[0]); err == nil || !strings.Contains(err.Error(), "token bound to its node") {
		t.Errorf("an agent without a node-bound token patching a pool: %v, want refused", err)
	}
	// A backup's status, only when the operator gave the backup to the agent's node.
	for _, n := range nodes {
		b := &storagev1alpha1.VolumeBackup{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "backup-" + n, Labels: map[string]string{storagev1alpha1.LabelBackupNode: n}},
			Spec:       storagev1alpha1.VolumeBackupSpec{Store: "s", Source: &storagev1alpha1.BackupSource{PersistentVolumeClaimName: "data"}},
		}
		if err := env.Client.Create(ctx, b); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), b) })
	}
	patchBackup := func(cfg *rest.Config, node string) error {
		c, err := client.New(cfg, client.Options{Scheme: scheme.Scheme})
		if err != nil {
			return err
		}
		b := &storagev1alpha1.VolumeBackup{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "backup-" + node}}
		return c.Status().Patch(ctx, b, client.RawPatch(types.MergePatchType, []byte(`{"status":{"bytesDone":1}}`)))
	}
	if err := patchBackup(bound, nodes[1]); err == nil || !strings.Contains(err.Error(), "may write only the backups given to its node") {
		t.Errorf("node A's agent writing the status of node B's backup: %v, want refused", err)
	}
	if err := patchBackup(bound, nodes[0]); err != nil {
		t.Errorf("node A's agent writing the status of its backup: %v", err)
	}
	// Others are not concerned: the admin may still write any node's pool.
	if err := patchPool(env.Config, nodes[1]); err != nil {
		t.Errorf("admin patching a pool: %v", err)
	}
}

// TestGrantedKeeper: a Keeper acting as the user GrantKeeper granted (up's token keeper)
// requests the granted accounts' tokens, bound to a Node too, and is refused any other
// account's token and what only an admin may do.
func TestGrantedKeeper(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	// Accounts in two namespaces, as up's: each namespace has a Role of the same name.
	namespaces, err := identity.Apply(ctx, env.Config, []string{"books", "pool-agent", "webhook-listener"}, identity.ApplyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if namespaces["books"] == namespaces["webhook-listener"] {
		t.Fatalf("books and webhook-listener share namespace %s: the test needs two", namespaces["books"])
	}
	const user = "identity-test:keeper"
	granted := namespaces
	if err := identity.GrantKeeper(ctx, env.Config, user, granted); err != nil {
		t.Fatal(err)
	}
	node := "keeper-node"
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}})
	})
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	k, err := identity.NewKeeper(cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Config(ctx, namespaces["books"], identity.ServiceAccount("books")); err != nil {
		t.Errorf("a granted account's token: %v", err)
	}
	if _, err := k.Config(ctx, namespaces["webhook-listener"], identity.ServiceAccount("webhook-listener")); err != nil {
		t.Errorf("a granted account's token in another namespace: %v", err)
	}
	if _, err := k.NodeConfig(ctx, namespaces["pool-agent"], identity.ServiceAccount("pool-agent"), node); err != nil {
		t.Errorf("a granted account's token bound to a Node: %v", err)
	}
	if _, err := k.Config(ctx, namespaces["books"], "default"); !apierrors.IsForbidden(err) {
		t.Errorf("another account's token: %v, want Forbidden", err)
	}
	if _, err := k.Config(ctx, "kube-system", "default"); !apierrors.IsForbidden(err) {
		t.Errorf("a kube-system account's token: %v, want Forbidden", err)
	}
	as := kubernetes.NewForConfigOrDie(cfg)
	if _, err := as.CoreV1().Secrets(namespaces["books"]).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing Secrets as the keeper: %v, want Forbidden", err)
	}
}
