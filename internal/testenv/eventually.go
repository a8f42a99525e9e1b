package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// Eventually calls cond until it reports done or timeout passes, then fails t with what and
// the reason cond last gave; an error from cond is that reason, not the end of the wait.
// It is wait.Eventually, which packages below testenv (those it imports, or tests that
// should not link a control plane) call directly.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (done bool, err error)) {
	t.Helper()
	wait.Eventually(t, timeout, what, cond)
}
