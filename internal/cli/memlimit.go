package cli

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"
)

// defaultMemoryLimit is none: the Go runtime's own policy, a collection once the heap has
// grown by as much as is live. A limit trades CPU for memory only where it binds: at
// 100,000 Books, 2Gi kept RSS near 2.4 GiB instead of about 4, and Books became Ready at
// 40 % of the rate without one (docs/performance.md, "Scale").
const defaultMemoryLimit = "0"

// memoryLimit is --memory-limit of the commands that run the control plane in their own
// process (up, and bench without --kubeconfig).
type memoryLimit struct {
	value string
	cmd   *cobra.Command
}

func (m *memoryLimit) flag(cmd *cobra.Command) {
	m.cmd = cmd
	cmd.Flags().StringVar(&m.value, "memory-limit", defaultMemoryLimit,
		"soft limit on this process's Go memory (control plane and services), as a quantity (1536Mi, 4Gi): "+
			"near it the runtime collects garbage more often, spending CPU to keep RSS down; set below what the process needs, "+
			"it slows everything down rather than failing; 0: none; "+
			"GOMEMLIMIT, when set, wins over the default")
}

// apply sets the limit and says what it is. GOMEMLIMIT in the environment is kept unless
// the flag was given.
func (m *memoryLimit) apply() (string, error) {
	if env := os.Getenv("GOMEMLIMIT"); env != "" && (m.cmd == nil || !m.cmd.Flags().Changed("memory-limit")) {
		return "GOMEMLIMIT=" + env, nil
	}
	q, err := resource.ParseQuantity(m.value)
	if err != nil {
		return "", fmt.Errorf("--memory-limit %q: %w", m.value, err)
	}
	n, ok := q.AsInt64()
	if !ok || n < 0 {
		return "", fmt.Errorf("--memory-limit %q: want a quantity of bytes from 0 up", m.value)
	}
	if n == 0 {
		debug.SetMemoryLimit(math.MaxInt64)
		return "none", nil
	}
	debug.SetMemoryLimit(n)
	return q.String() + " (soft)", nil
}
