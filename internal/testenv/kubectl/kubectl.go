package kubectl

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// DefaultTimeout bounds one command when Client.Timeout is zero.
const DefaultTimeout = 2 * time.Minute

// Client runs commands against the cluster of Kubeconfig.
type Client struct {
	// Kubeconfig is exported to every command as KUBECONFIG ("": not set).
	Kubeconfig string
	// Env ("NAME=value") is added to every command's environment, as variables exported in
	// the user's shell are.
	Env []string
	// Dir is the commands' working directory ("": the test's).
	Dir string
	// Timeout bounds each command (0: DefaultTimeout).
	Timeout time.Duration
	// State, if set, adds to Dump what else a failure needs: a process's output, logs.
	State func() string
}

// Command is name args... with the client's environment and directory, ended with ctx.
func (c *Client) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = c.Dir
	cmd.Env = append(os.Environ(), c.Env...)
	if c.Kubeconfig != "" {
		cmd.Env = append(cmd.Env, "KUBECONFIG="+c.Kubeconfig)
	}
	// A child that keeps the output pipes open (a daemon it started) must not hang the test.
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// Run runs name args... and returns its combined output.
func (c *Client) Run(name string, args ...string) (string, error) {
	return c.RunFor(c.timeout(), name, args...)
}

// RunIn is Run in the working directory dir ("": the test's).
func (c *Client) RunIn(dir, name string, args ...string) (string, error) {
	in := *c
	in.Dir = dir
	return in.Run(name, args...)
}

// RunFor is Run with its own timeout.
func (c *Client) RunFor(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := c.Command(ctx, name, args...).CombinedOutput()
	return string(out), err
}

// Kubectl runs kubectl args... and returns its output; it fails t, with the output, when
// kubectl fails.
func (c *Client) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := c.Run("kubectl", args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// Apply is kubectl apply -f - of manifest (YAML or JSON, one or more documents).
func (c *Client) Apply(t testing.TB, manifest string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout())
	defer cancel()
	cmd := c.Command(ctx, "kubectl", "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(manifest)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v\n%s\n%s", err, out, manifest)
	}
}

// Wait runs kubectl wait --timeout=timeout args...; when it fails, it fails t with what
// the objects are (Dump).
func (c *Client) Wait(t testing.TB, timeout time.Duration, args ...string) {
	t.Helper()
	full := append([]string{"wait", "--timeout=" + timeout.String()}, args...)
	out, err := c.RunFor(timeout+30*time.Second, "kubectl", full...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s\n%s", strings.Join(full, " "), err, out, c.Dump())
	}
}

// Eventually waits, until timeout, for cond to hold (package wait), and fails t with the
// reason cond last gave and the cluster's state (Dump). For what kubectl has nothing to
// wait for.
func (c *Client) Eventually(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	if err := wait.Until(context.Background(), timeout, cond); err != nil {
		t.Fatalf("%s: %v\n%s", what, err, c.Dump())
	}
}

// Dump is the state a failure needs to be understood: nodes, pods, claims, volumes and
// events of every namespace, then State's.
func (c *Client) Dump() string {
	var b strings.Builder
	if c.Kubeconfig != "" {
		for _, args := range [][]string{
			{"get", "nodes,pods,pvc,pv,volumeattachments", "-A", "-o", "wide"},
			{"get", "events", "-A", "--sort-by=.lastTimestamp"},
		} {
			out, _ := c.RunFor(time.Minute, "kubectl", args...)
			fmt.Fprintf(&b, "$ kubectl %s\n%s\n", strings.Join(args, " "), Tail(out, 60))
		}
	}
	if c.State != nil {
		b.WriteString(c.State())
	}
	return b.String()
}

// Tail is the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (c *Client) timeout() time.Duration {
	if c.Timeout > 0 {
		return c.Timeout
	}
	return DefaultTimeout
}
