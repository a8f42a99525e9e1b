package ipc

import (
	"errors"
	"fmt"
	"time"

	"github.com/crdipc/crdipc/api/conditions"
)

// Result is a handler's verdict on the current generation of a request.
type Result struct {
	// Ready means the request is done: Ready=True.
	Ready bool
	// Reason explains Ready=False; it must not be terminal (return a
	// Terminal error for that). Default: Reconciling.
	Reason string
	// Message is for humans: kubectl describe, crdipc call.
	Message string
	// RequeueAfter, when positive, calls the handler again after this long
	// even if nothing changes, e.g. to compare the world with the status.
	RequeueAfter time.Duration
	// HoldStatus, when positive on a Result that is not Ready, says that the
	// progress it reports is about to be overtaken: the handler has just
	// started work whose completion will call it again (through a watch). The
	// receiver then writes nothing now, neither status nor Event, and calls
	// the handler again after HoldStatus if nothing else does first. A
	// request that completes quickly thus goes from no verdict straight to
	// Ready, one status write and one Event instead of three of each; one
	// that does not still shows its progress after HoldStatus. A hold applies
	// only while the stored status has no verdict on the current generation
	// yet; otherwise the Result is written as usual.
	HoldStatus time.Duration
}

// Done is the Result of a finished request.
func Done(message string) Result { return Result{Ready: true, Message: message} }

// Waiting is the Result of a request that cannot finish until the cluster
// changes; the handler is called again on changes or after requeueAfter.
func Waiting(reason, message string, requeueAfter time.Duration) Result {
	return Result{Reason: reason, Message: message, RequeueAfter: requeueAfter}
}

// terminalError marks a failure the receiver will not retry for this
// generation. Senders see it as a *TerminalError from Await.
type terminalError struct {
	reason, message string
}

func (e *terminalError) Error() string { return e.reason + ": " + e.message }

// Terminal returns an error that ends the request: Ready=False with reason
// Failed and the formatted message, no retry until the spec changes.
func Terminal(format string, args ...any) error {
	return &terminalError{reason: conditions.ReasonFailed, message: fmt.Sprintf(format, args...)}
}

// InvalidSpec is Terminal with reason InvalidSpec: the spec passed schema
// validation but cannot be served as written.
func InvalidSpec(format string, args ...any) error {
	return &terminalError{reason: conditions.ReasonInvalidSpec, message: fmt.Sprintf(format, args...)}
}

func asTerminal(err error) (*terminalError, bool) {
	var t *terminalError
	ok := errors.As(err, &t)
	return t, ok
}
