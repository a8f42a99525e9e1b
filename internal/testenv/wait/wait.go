// Package wait is how crdipc's tests wait for a condition: poll it, briefly at first, until
// it holds or a deadline passes, then fail with what was awaited and why it never held.
//
// It imports nothing of crdipc's, so every test can use it, including the tests of packages
// that internal/testenv itself imports (testenv.Eventually is this package's Eventually).
package wait

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// Polls start fast, so a condition that holds a moment later costs the test no more than a
// moment, and slow down to maxInterval, so a long wait does not load the API server or a
// two-core machine.
const (
	firstInterval = time.Millisecond
	maxInterval   = 50 * time.Millisecond
)

// Eventually calls cond until it reports done or timeout passes, then fails t with what and
// the reason cond last gave.
//
// An error from cond does not end the wait: it says why the condition does not hold yet
// (API calls fail for a while when a server restarts, a phase is still Pending, ...) and is
// the reason reported at the deadline, so return a descriptive one. cond runs on the calling
// goroutine and may call t.Fatal to give up at once. Its ctx ends at the deadline.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (done bool, err error)) {
	t.Helper()
	if err := Until(context.Background(), timeout, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Until is Eventually for a caller that handles the outcome itself: it returns nil once cond
// reports done with no error, or, when timeout passes or ctx ends first, an error that wraps
// the reason cond last gave.
func Until(ctx context.Context, timeout time.Duration, cond func(ctx context.Context) (done bool, err error)) error {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, errTimeout)
	defer cancel()
	var (
		last    error // the last attempt's reason, nil if it gave none
		earlier error // the latest reason any attempt gave
	)
	interval := firstInterval
	for {
		done, err := cond(ctx)
		if done && err == nil {
			return nil
		}
		// An attempt cut short by the deadline fails because of the deadline; the attempts
		// before it say why the condition did not hold.
		if ctx.Err() == nil || earlier == nil {
			last = err
			if err != nil {
				earlier = err
			}
		}
		select {
		case <-ctx.Done():
			return notMet(ctx, timeout, last, earlier)
		case <-time.After(interval):
		}
		interval = min(2*interval, maxInterval)
	}
}

// errTimeout tells Until's own deadline from the end of the caller's ctx.
var errTimeout = errors.New("timeout")

func notMet(ctx context.Context, timeout time.Duration, last, earlier error) error {
	why := fmt.Sprintf("not within %v", timeout)
	if cause := context.Cause(ctx); cause != errTimeout {
		why = fmt.Sprintf("wait ended (%v)", cause)
	}
	switch {
	case last != nil:
		return fmt.Errorf("%s: %w", why, last)
	case earlier != nil:
		return fmt.Errorf("%s: condition still false; earlier: %w", why, earlier)
	default:
		return fmt.Errorf("%s: condition still false", why)
	}
}

// HTTPOK is a condition that holds once a GET of url answers 200 OK; until then its error
// says what answered instead.
func HTTPOK(url string) func(ctx context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		return true, nil
	}
}
