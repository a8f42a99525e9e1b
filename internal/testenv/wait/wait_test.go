package wait_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/wait"
)

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	wait.Eventually(t, 10*time.Second, "third call", func(context.Context) (bool, error) {
		calls++
		if calls < 3 {
			return false, fmt.Errorf("call %d", calls)
		}
		return true, nil
	})
	if calls != 3 {
		t.Fatalf("cond called %d times, want 3", calls)
	}
}

func TestUntilReportsTheLastReason(t *testing.T) {
	notYet := errors.New("phase Pending")
	err := wait.Until(context.Background(), 30*time.Millisecond, func(context.Context) (bool, error) {
		return false, notYet
	})
	if !errors.Is(err, notYet) || !strings.Contains(err.Error(), "not within 30ms") {
		t.Fatalf("Until = %v, want the deadline and the last reason", err)
	}

	// A reason given earlier is still worth reporting when the last attempts gave none.
	calls := 0
	err = wait.Until(context.Background(), 30*time.Millisecond, func(context.Context) (bool, error) {
		calls++
		if calls == 1 {
			return false, notYet
		}
		return false, nil
	})
	if !errors.Is(err, notYet) || !strings.Contains(err.Error(), "still false") {
		t.Fatalf("Until = %v, want still false with the earlier reason", err)
	}
}

func TestUntilKeepsTheReasonWhenTheDeadlineCutsAnAttempt(t *testing.T) {
	notYet := errors.New("2 of 3 replicas")
	calls := 0
	err := wait.Until(context.Background(), 30*time.Millisecond, func(ctx context.Context) (bool, error) {
		calls++
		if calls == 1 {
			return false, notYet
		}
		<-ctx.Done() // an API call that the deadline cancels
		return false, ctx.Err()
	})
	if !errors.Is(err, notYet) {
		t.Fatalf("Until = %v, want the reason from before the deadline", err)
	}
}

func TestUntilEndsWithTheCallersContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := wait.Until(ctx, time.Minute, func(context.Context) (bool, error) { return false, nil })
	if err == nil || strings.Contains(err.Error(), "not within") {
		t.Fatalf("Until with a cancelled ctx = %v, want it to say the wait was cancelled", err)
	}
}
