package testenv

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"

	"github.com/crdipc/crdipc/internal/install"
)

// AsServiceAccount creates the objects a service ships in config/rbac/<name>
// (its ServiceAccount crdipc-<name> in crdipc-system, its generated roles
// and their bindings), as `kubectl apply -k` would, and returns a config
// that acts as that ServiceAccount. Tests run a component with it to show
// that exactly the shipped permissions are enough, and no more are granted.
func (e *Env) AsServiceAccount(t testing.TB, name string) *rest.Config {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "config", "rbac", name)
	for _, f := range []string{"service_account.yaml", "role.yaml", "role_binding.yaml"} {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s/%s: %v", name, f, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			if err := e.Client.Create(context.Background(), u); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("%s/%s: creating %s %s: %v", name, f, u.GetKind(), u.GetName(), err)
			}
		}
	}
	cfg := rest.CopyConfig(e.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + install.SystemNamespace + ":crdipc-" + name}
	return cfg
}

// repoRoot is the directory holding go.mod, found upwards from the test's
// working directory (its package directory).
func repoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("testenv: no go.mod above the test's directory")
		}
		dir = parent
	}
}
