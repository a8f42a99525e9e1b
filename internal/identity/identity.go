package identity

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/crdipc/crdipc/config/rbac"
	"github.com/crdipc/crdipc/internal/safefile"
)

// FieldManager names the identity objects' writes in managedFields.
const FieldManager = "crdipc-identity"

// ServiceAccount is the ServiceAccount of a crdipc service, as config/rbac ships it.
func ServiceAccount(service string) string { return "crdipc-" + service }

// Username is how the API server names service's ServiceAccount in namespace, e.g. for
// `kubectl auth can-i --as`.
func Username(namespace, service string) string {
	return "system:serviceaccount:" + namespace + ":" + ServiceAccount(service)
}

// ApplyOptions adjust the shipped RBAC to one cluster.
type ApplyOptions struct {
	// BindIn moves the namespaced bindings of a service into another namespace: the SCM
	// services are bound where their PullRequests live (crdipc-scm as shipped, --scm-namespace
	// in up).
	BindIn map[string]string
}

// Apply creates or updates (server-side apply) the ServiceAccount, roles and bindings
// shipped for each service, and the admission policies that narrow them, and returns, per service, the namespace of its ServiceAccount.
// Namespaces the accounts live in are created if missing.
func Apply(ctx context.Context, cfg *rest.Config, services []string, o ApplyOptions) (map[string]string, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("identities: %w", err)
	}
	namespaces := map[string]string{}
	objects := map[string][]*unstructured.Unstructured{}
	var toEnsure []string
	for _, svc := range services {
		objs, err := rbac.Objects(svc)
		if err != nil {
			return nil, err
		}
		for _, u := range objs {
			switch u.GetKind() {
			case "ServiceAccount":
				namespaces[svc] = u.GetNamespace()
			case "RoleBinding":
				if to := o.BindIn[svc]; to != "" {
					u.SetNamespace(to)
				}
			}
			if ns := u.GetNamespace(); ns != "" && !slices.Contains(toEnsure, ns) {
				toEnsure = append(toEnsure, ns)
			}
		}
		if namespaces[svc] == "" {
			return nil, fmt.Errorf("identities: config/rbac/%s ships no ServiceAccount", svc)
		}
		objects[svc] = objs
	}
	for _, ns := range toEnsure {
		if err := ensureNamespace(ctx, kube, ns); err != nil {
			return nil, err
		}
	}
	// The services in parallel: each write waits for etcd's fsync, which concurrent writes
	// share, so this takes about as long as the largest service's objects in a row.
	g, gctx := errgroup.WithContext(ctx)
	for _, svc := range services {
		g.Go(func() error {
			for _, u := range objects[svc] {
				if err := applyObject(gctx, kube, svc, u); err != nil {
					return err
				}
			}
			if err := waitEnforced(gctx, kube, Username(namespaces[svc], svc), objects[svc]); err != nil {
				return fmt.Errorf("identities: %s: %w", svc, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return namespaces, nil
}

// applyObject server-side applies one shipped identity object of svc.
func applyObject(ctx context.Context, kube kubernetes.Interface, svc string, u *unstructured.Unstructured) error {
	body, err := json.Marshal(u.Object)
	if err != nil {
		return fmt.Errorf("identities: encoding %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	req := kube.RbacV1().RESTClient().Patch(types.ApplyPatchType)
	switch u.GetKind() {
	case "ServiceAccount":
		req = kube.CoreV1().RESTClient().Patch(types.ApplyPatchType).Resource("serviceaccounts")
	case "ClusterRole":
		req = req.Resource("clusterroles")
	case "ClusterRoleBinding":
		req = req.Resource("clusterrolebindings")
	case "Role":
		req = req.Resource("roles")
	case "RoleBinding":
		req = req.Resource("rolebindings")
	case "ValidatingAdmissionPolicy":
		req = kube.AdmissionregistrationV1().RESTClient().Patch(types.ApplyPatchType).Resource("validatingadmissionpolicies")
	case "ValidatingAdmissionPolicyBinding":
		req = kube.AdmissionregistrationV1().RESTClient().Patch(types.ApplyPatchType).Resource("validatingadmissionpolicybindings")
	default:
		return fmt.Errorf("identities: config/rbac/%s ships a %s, which is not an identity object", svc, u.GetKind())
	}
	if ns := u.GetNamespace(); ns != "" {
		req = req.Namespace(ns)
	}
	err = req.Name(u.GetName()).
		VersionedParams(&metav1.PatchOptions{FieldManager: FieldManager, Force: ptr.To(true)}, metav1.ParameterCodec).
		Body(body).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("identities: applying %s %s of %s: %w", u.GetKind(), u.GetName(), svc, err)
	}
	return nil
}

// waitEnforced returns once the authorizer grants user, through each binding in objs, the
// first rule of the role it binds. The RBAC authorizer reads bindings from an informer, so
// for a moment after they are written a service would be refused what its role allows; a
// service started right after Apply must not see that.
func waitEnforced(ctx context.Context, kube kubernetes.Interface, user string, objs []*unstructured.Unstructured) error {
	rules := map[string][]rbacv1.PolicyRule{} // by "<kind>/<namespace>/<name>": one Role name may be in several namespaces
	var bindings []*unstructured.Unstructured
	for _, u := range objs {
		switch u.GetKind() {
		case "Role", "ClusterRole":
			var role rbacv1.ClusterRole // a Role has the same rules field
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &role); err != nil {
				return err
			}
			rules[u.GetKind()+"/"+u.GetNamespace()+"/"+u.GetName()] = role.Rules
		case "RoleBinding", "ClusterRoleBinding":
			bindings = append(bindings, u)
		}
	}
	for _, b := range bindings {
		var binding rbacv1.RoleBinding // a ClusterRoleBinding has the same roleRef field
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(b.Object, &binding); err != nil {
			return err
		}
		var attrs *authorizationv1.ResourceAttributes
		roleNS := b.GetNamespace() // a RoleBinding's Role is in its namespace; a ClusterRole in none
		if binding.RoleRef.Kind == "ClusterRole" {
			roleNS = ""
		}
		for _, r := range rules[binding.RoleRef.Kind+"/"+roleNS+"/"+binding.RoleRef.Name] {
			if len(r.Verbs) > 0 && len(r.Resources) > 0 && len(r.APIGroups) > 0 {
				attrs = &authorizationv1.ResourceAttributes{Namespace: b.GetNamespace(), Verb: r.Verbs[0], Group: r.APIGroups[0], Resource: r.Resources[0]}
				if len(r.ResourceNames) > 0 {
					attrs.Name = r.ResourceNames[0]
				}
				break
			}
		}
		if attrs == nil {
			continue
		}
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: []string{"system:serviceaccounts", "system:authenticated"}, ResourceAttributes: attrs,
		}}
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got, err := kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err != nil {
				return false, err
			}
			return got.Status.Allowed, nil
		})
		if err != nil {
			return fmt.Errorf("%s %s is not enforced yet (%s %s/%s in %q): %w", b.GetKind(), b.GetName(), attrs.Verb, attrs.Group, attrs.Resource, attrs.Namespace, err)
		}
	}
	return nil
}

func ensureNamespace(ctx context.Context, kube kubernetes.Interface, name string) error {
	_, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("identities: creating namespace %s: %w", name, err)
	}
	return nil
}

// TokenTTL is how long each token the Keeper requests is valid; it renews them at a third
// of it, so a token read from the file is always good for at least 40 minutes.
const TokenTTL = time.Hour

// A Keeper keeps ServiceAccount tokens fresh in files under its directory,
// <dir>/<namespace>/<account>.token, next to a kubeconfig, <account>.kubeconfig, that names
// the token file (tokenFile: client-go reads it again as it changes).
type Keeper struct {
	kube   kubernetes.Interface // requests the tokens
	server *rest.Config
	dir    string

	mu       sync.Mutex
	accounts map[account]bool
}

// account is one token the Keeper keeps: a ServiceAccount's, bound to a Node when node is
// set.
type account struct {
	namespace, name, node string
}

// file is the base name of the account's token and kubeconfig files.
func (a account) file() string {
	if a.node != "" {
		return a.name + "@" + a.node
	}
	return a.name
}

// NewKeeper returns a Keeper that requests tokens with cfg, an identity GrantKeeper granted
// (or an admin's), and writes under dir.
func NewKeeper(cfg *rest.Config, dir string) (*Keeper, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("identities: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("identities: %w", err)
	}
	return &Keeper{kube: kube, server: cfg, dir: dir, accounts: map[account]bool{}}, nil
}

// Config writes a fresh token of the ServiceAccount namespace/name and its kubeconfig,
// keeps the token fresh from now on (see Run), and returns a client config that
// authenticates with it and nothing else.
func (k *Keeper) Config(ctx context.Context, namespace, name string) (*rest.Config, error) {
	return k.config(ctx, account{namespace: namespace, name: name})
}

// NodeConfig is Config with a token bound to the Node node, as a DaemonSet pod's projected
// token is bound to its pod on that node: the API server marks whoever uses it with the user
// extra authentication.kubernetes.io/node-name (what the pool agents' node restriction
// checks), and the token dies with the Node.
func (k *Keeper) NodeConfig(ctx context.Context, namespace, name, node string) (*rest.Config, error) {
	return k.config(ctx, account{namespace: namespace, name: name, node: node})
}

func (k *Keeper) config(ctx context.Context, a account) (*rest.Config, error) {
	if err := k.renew(ctx, a); err != nil {
		return nil, err
	}
	k.mu.Lock()
	k.accounts[a] = true
	k.mu.Unlock()
	cfg := rest.AnonymousClientConfig(k.server)
	cfg.BearerTokenFile = k.tokenPath(a)
	cfg.QPS, cfg.Burst = k.server.QPS, k.server.Burst
	return cfg, nil
}

// Kubeconfig is the kubeconfig file Config wrote for namespace/name.
func (k *Keeper) Kubeconfig(namespace, name string) string {
	return k.kubeconfigPath(account{namespace: namespace, name: name})
}

func (k *Keeper) kubeconfigPath(a account) string {
	return filepath.Join(k.dir, a.namespace, a.file()+".kubeconfig")
}

func (k *Keeper) tokenPath(a account) string {
	return filepath.Join(k.dir, a.namespace, a.file()+".token")
}

// Run renews every token Config handed out, at a third of its lifetime, until ctx ends.
func (k *Keeper) Run(ctx context.Context) {
	t := time.NewTicker(TokenTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		k.mu.Lock()
		keys := make([]account, 0, len(k.accounts))
		for key := range k.accounts {
			keys = append(keys, key)
		}
		k.mu.Unlock()
		for _, key := range keys {
			// A failed renewal leaves the old token, valid for another 40 minutes: the next
			// tick tries again.
			_ = k.renew(ctx, key)
		}
	}
}

func (k *Keeper) renew(ctx context.Context, key account) error {
	spec := authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(TokenTTL.Seconds()))}
	if key.node != "" {
		node, err := k.kube.CoreV1().Nodes().Get(ctx, key.node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("identities: a token of %s/%s bound to node %s: %w", key.namespace, key.name, key.node, err)
		}
		spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: node.Name, UID: node.UID}
	}
	tr, err := k.kube.CoreV1().ServiceAccounts(key.namespace).CreateToken(ctx, key.name, &authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("identities: requesting a token of %s/%s: %w", key.namespace, key.name, err)
	}
	if err := os.MkdirAll(filepath.Join(k.dir, key.namespace), 0o700); err != nil {
		return fmt.Errorf("identities: %w", err)
	}
	if err := writeFile(k.tokenPath(key), []byte(tr.Status.Token)); err != nil {
		return err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["crdipc"] = &clientcmdapi.Cluster{Server: k.server.Host, CertificateAuthorityData: k.server.CAData, CertificateAuthority: k.server.CAFile}
	kc.AuthInfos[key.file()] = &clientcmdapi.AuthInfo{TokenFile: k.tokenPath(key)}
	kc.Contexts[key.file()] = &clientcmdapi.Context{Cluster: "crdipc", AuthInfo: key.file(), Namespace: key.namespace}
	kc.CurrentContext = key.file()
	data, err := clientcmd.Write(*kc)
	if err != nil {
		return fmt.Errorf("identities: %w", err)
	}
	return writeFile(k.kubeconfigPath(key), data)
}

// writeFile replaces path atomically, so a reader never sees half a token.
func writeFile(path string, data []byte) error {
	if err := safefile.Write(path, data, 0o600); err != nil {
		return fmt.Errorf("identities: %w", err)
	}
	return nil
}
