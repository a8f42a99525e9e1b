package require

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Capable skips t when err says a capability is missing, or fails it when the environment
// variable env is "1".
func Capable(t testing.TB, env string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if Required(env) {
		t.Fatalf("%s=1 but: %v", env, err)
	}
	t.Skipf("%v (set %s=1 to fail instead)", err, env)
}

// Strict fails t with err when env is "1", and otherwise returns err: for a test that works
// around a missing capability (another path, a spec skipped) instead of skipping.
func Strict(t testing.TB, env string, err error) error {
	t.Helper()
	if err != nil && Required(env) {
		t.Fatalf("%s=1 but: %v", env, err)
	}
	return err
}

// Required says whether the capability of env must be there: env is "1".
func Required(env string) bool { return os.Getenv(env) == "1" }

// Tool returns the path of the first of names found in PATH (several names: one tool
// packaged under different names). Without any, it is Capable with that error.
func Tool(t testing.TB, env string, names ...string) string {
	t.Helper()
	path, err := Find(names...)
	Capable(t, env, err)
	return path
}

// Tools is Capable with an error naming every one of names missing from PATH.
func Tools(t testing.TB, env string, names ...string) {
	t.Helper()
	Capable(t, env, Missing(names...))
}

// Find returns the path of the first of names found in PATH.
func Find(names ...string) (string, error) {
	if len(names) == 0 {
		return "", errors.New("no tool named")
	}
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s is not installed (hack/test-deps.sh or hack/realnode.sh deps installs it)", strings.Join(names, " or "))
}

// Missing is an error naming every one of names missing from PATH, or nil when all are
// there.
func Missing(names ...string) error {
	var missing []string
	for _, name := range names {
		if _, err := exec.LookPath(name); err != nil {
			missing = append(missing, name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("missing %s", strings.Join(missing, ", "))
}
