package testenv

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/rest"

	"github.com/crdipc/crdipc/internal/identity"
)

// AsServiceAccount creates the objects a service ships in config/rbac/<name> (its
// ServiceAccount crdipc-<name>, its generated roles and their bindings) as `crdipc up` does,
// and returns a config that acts as that ServiceAccount. Tests run a component with it to
// show that exactly the shipped permissions are enough, and no more are granted. The
// namespaced bindings of the SCM services go into bindIn, when given: they are granted
// where their objects live.
func (e *Env) AsServiceAccount(t testing.TB, name string, bindIn ...string) *rest.Config {
	t.Helper()
	o := identity.ApplyOptions{}
	if len(bindIn) > 0 {
		o.BindIn = map[string]string{name: bindIn[0]}
	}
	namespaces, err := identity.Apply(context.Background(), e.Config, []string{name}, o)
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: identity.Username(namespaces[name], name)}
	return cfg
}

// NodeNameExtra is the user extra the API server sets from a Node- or Pod-bound
// ServiceAccount token: the node the token was issued for.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// AsPoolAgent is AsServiceAccount(t, "pool-agent") for the agent of node: it acts as one
// holding a token bound to node does, with the user extra the pool agents' node restriction
// (config/rbac/pool-agent/node_restriction.yaml) checks.
func (e *Env) AsPoolAgent(t testing.TB, node string) *rest.Config {
	t.Helper()
	return BoundTo(e.AsServiceAccount(t, "pool-agent"), node)
}

// BoundTo is cfg, a config from AsServiceAccount, acting as the holder of a token of that
// ServiceAccount bound to node: what the storage operator asks of a node's data-path
// certificate request. It calls no API, so it may run where a test may not fail.
func BoundTo(cfg *rest.Config, node string) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Impersonate.Extra = map[string][]string{NodeNameExtra: {node}}
	return cfg
}

// AsNode is a config that acts as node's kubelet, system:node:<node> in group system:nodes,
// with a client certificate from the cluster's CA, as `crdipc up` gives each simulated
// node: the Node authorizer and NodeRestriction admission judge what it does.
func (e *Env) AsNode(t testing.TB, node string) *rest.Config {
	t.Helper()
	cfg, err := e.cp.NodeConfig(node)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// WithToken is cfg, a config from AsServiceAccount (or BoundTo), authenticating with a token
// of that ServiceAccount (bound to the node, for BoundTo's) instead of impersonating it, as
// `crdipc up`'s services do. Impersonation is resolved after authentication by the admin's
// certificate, so the filters before it (kube-apiserver's tracing, for one, which trusts a
// caller's trace context only from system:masters) see the admin, not the ServiceAccount.
func (e *Env) WithToken(t testing.TB, cfg *rest.Config) *rest.Config {
	t.Helper()
	tokenCfg, err := e.Tokens(t).For(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tokenCfg
}

// Tokens hands out ServiceAccount tokens (see WithToken), also where a test may not fail.
type Tokens struct{ k *identity.Keeper }

// Tokens returns a source of tokens, kept in a directory of the test.
func (e *Env) Tokens(t testing.TB) *Tokens {
	t.Helper()
	k, err := identity.NewKeeper(e.Config, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return &Tokens{k: k}
}

// For is WithToken's config for cfg.
func (tk *Tokens) For(cfg *rest.Config) (*rest.Config, error) {
	ns, name, err := serviceaccount.SplitUsername(cfg.Impersonate.UserName)
	if err != nil {
		return nil, fmt.Errorf("not a ServiceAccount config: %w", err)
	}
	if node := cfg.Impersonate.Extra[NodeNameExtra]; len(node) == 1 {
		return tk.k.NodeConfig(context.Background(), ns, name, node[0])
	}
	return tk.k.Config(context.Background(), ns, name)
}
