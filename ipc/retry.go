package ipc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
)

// maxInFlight bounds the API requests that ipc has open at once in one
// process; an open watch counts until the API server has answered it, not
// while it streams. Thousands of concurrent Calls would otherwise each open
// a connection of their own: an API server serves 100 streams on one HTTP/2
// connection, and Go's transport dials one more connection for every request
// that finds them all taken. After an API server restart, that is thousands
// of TLS handshakes at the moment it starts, which measured as slowing its
// start threefold on two cores.
const maxInFlight = 64

var inFlight = make(chan struct{}, maxInFlight)

// limited runs the API request f once a slot is free (see maxInFlight).
func limited(ctx context.Context, f func() error) error {
	select {
	case inFlight <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-inFlight }()
	return f()
}

// transient reports whether an API call may succeed if repeated: the API
// server was unreachable, restarting, overloaded or too slow to answer. A
// write that failed so may or may not have been stored. Every other answer
// of the API server (bad request, forbidden, not found, conflict, ...) and
// every refusal of the client itself (unknown kind) is final.
func transient(err error) bool {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code == http.StatusTooManyRequests || code >= http.StatusInternalServerError ||
			// A restarted API server admits writes to a namespace only once it
			// has read the namespaces; until then it answers 403 for them.
			apierrors.IsForbidden(err) && strings.Contains(err.Error(), "not yet ready to handle request")
	}
	// No answer from the API server: the connection failed or broke.
	return !runtime.IsNotRegisteredError(err) && !meta.IsNoMatchError(err) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// retry calls f until it succeeds, fails for good (see transient) or ctx
// ends, with backoff between the attempts. When ctx ends, the error wraps
// both ctx's error and the last attempt's.
func retry(ctx context.Context, backoff *wait.Backoff, f func() error) error {
	for {
		err := f()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("%w (last attempt: %w)", ctx.Err(), err)
		case !transient(err):
			return err
		}
		if serr := sleepCtx(ctx, backoff.Step()); serr != nil {
			return fmt.Errorf("%w (last attempt: %w)", serr, err)
		}
	}
}

// newBackoff is the pace of retries against an API server that is away: the
// first retry comes quickly (a dropped connection is re-established at once),
// later ones no more often than every two seconds, jittered so that many
// waiting clients do not all come back at the same instant.
func newBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: 50 * time.Millisecond, Factor: 2, Jitter: 0.5, Steps: 1 << 30, Cap: 2 * time.Second}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
