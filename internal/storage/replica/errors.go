package replica

import "errors"

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
	// ErrClosed: the connection is closed; every call on it fails with this.
	ErrClosed = errors.New("replica connection closed")
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
)

var statusErrors = map[uint8]error{
	statusBusy:      ErrBusy,
	statusNotFound:  ErrNotFound,
	statusNoSession: ErrNoSession,
	statusTooLarge:  ErrTooLarge,
	statusInvalid:   ErrInvalid,
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
