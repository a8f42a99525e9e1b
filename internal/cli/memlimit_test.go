package cli

import (
	"math"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// --memory-limit sets the runtime's soft limit, 0 lifts it, a bad quantity is refused, and
// GOMEMLIMIT in the environment is kept unless the flag is given.
func TestMemoryLimit(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })

	run := func(args ...string) (string, error) {
		var m memoryLimit
		cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
		m.flag(cmd)
		if err := cmd.ParseFlags(args); err != nil {
			return "", err
		}
		return m.apply()
	}

	t.Setenv("GOMEMLIMIT", "")
	for _, tc := range []struct {
		args  []string
		limit int64
		says  string
	}{
		{nil, math.MaxInt64, "none"},
		{[]string{"--memory-limit=2Gi"}, 2 << 30, "2Gi"},
		{[]string{"--memory-limit=1536Mi"}, 1536 << 20, "1536Mi"},
		{[]string{"--memory-limit=3G"}, 3e9, "3G"},
		{[]string{"--memory-limit=0"}, math.MaxInt64, "none"},
	} {
		said, err := run(tc.args...)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got := debug.SetMemoryLimit(-1); got != tc.limit || !strings.Contains(said, tc.says) {
			t.Errorf("%v: limit %d, said %q; want %d, %q", tc.args, got, said, tc.limit, tc.says)
		}
	}
	for _, bad := range []string{"lots", "-1Gi", "1.5"} {
		if _, err := run("--memory-limit=" + bad); err == nil || !strings.Contains(err.Error(), "--memory-limit") {
			t.Errorf("--memory-limit=%s: got %v, want an error naming the flag", bad, err)
		}
	}

	t.Setenv("GOMEMLIMIT", "3GiB")
	debug.SetMemoryLimit(3 << 30) // what the runtime read at start
	if said, err := run(); err != nil || said != "GOMEMLIMIT=3GiB" || debug.SetMemoryLimit(-1) != 3<<30 {
		t.Errorf("with GOMEMLIMIT set: said %q, %v, limit %d; want the environment's kept", said, err, debug.SetMemoryLimit(-1))
	}
	if _, err := run("--memory-limit=1Gi"); err != nil || debug.SetMemoryLimit(-1) != 1<<30 {
		t.Errorf("the flag given wins over GOMEMLIMIT: limit %d, %v", debug.SetMemoryLimit(-1), err)
	}
}
