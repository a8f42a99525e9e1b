package replica

import (
	"errors"
	"fmt"
	"syscall"
)

// Sentinel errors. They travel as status codes, so errors.Is works on errors returned by a
// Client as well as on the server side.
var (
	// ErrBusy: another connection holds the replica's writer session.
	ErrBusy = errors.New("replica busy: writer session held by another connection")
	// ErrNotFound: the server has no such replica (Lookup failed or the file is missing).
	ErrNotFound = errors.New("replica not found")
	// ErrNoSession: a write-side call (WriteAt, Flush, CloseSession) on a connection that
	// does not hold the writer session.
	ErrNoSession = errors.New("no writer session on this connection")
	// ErrTooLarge: a frame exceeded MaxPayload. The connection stays usable.
	ErrTooLarge = errors.New("request too large")
	// ErrInvalid: a malformed request, e.g. out of range or unaligned.
	ErrInvalid = errors.New("invalid request")
	// ErrNoSpace: the replica's file system is full (ENOSPC, or EDQUOT for a quota). The
	// write, copy or flush failed and changed nothing that a later rebuild relies on.
	ErrNoSpace = errors.New("no space left on the replica's file system (ENOSPC)")
	// ErrClosed: the connection is closed; every call on it fails with this.
	ErrClosed = errors.New("replica connection closed")
	// ErrForbidden: the server's Authorize refused the peer this replica.
	ErrForbidden = errors.New("forbidden")
)

// Wire status codes. Never renumber: they are the protocol.
const (
	statusOK        uint8 = 0
	statusError     uint8 = 1
	statusBusy      uint8 = 2
	statusNotFound  uint8 = 3
	statusNoSession uint8 = 4
	statusTooLarge  uint8 = 5
	statusInvalid   uint8 = 6
	statusNoSpace   uint8 = 7
	statusForbidden uint8 = 8
)

var statusErrors = map[uint8]error{
	statusBusy:      ErrBusy,
	statusNotFound:  ErrNotFound,
	statusNoSession: ErrNoSession,
	statusTooLarge:  ErrTooLarge,
	statusInvalid:   ErrInvalid,
	statusNoSpace:   ErrNoSpace,
	statusForbidden: ErrForbidden,
}

// noSpace marks a file system's "full" errors with ErrNoSpace, so they travel as such.
func noSpace(err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	}
	return err
}

func statusOf(err error) uint8 {
	for code, sentinel := range statusErrors {
		if errors.Is(err, sentinel) {
			return code
		}
	}
	return statusError
}

// RemoteError is an error reported by the server. Its message is the server's; Unwrap gives
// the matching sentinel, if any.
type RemoteError struct {
	Code uint8
	Msg  string
}

func (e *RemoteError) Error() string { return e.Msg }

func (e *RemoteError) Unwrap() error { return statusErrors[e.Code] }
