package testenv

import (
	"context"
	"testing"

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
