package fdstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/localsock"
)

// ErrNotFound is returned by Client.Get for a name the store does not hold.
var ErrNotFound = errors.New("not in the descriptor store")

// MaxEntries bounds what one store holds, so that a misbehaving client cannot exhaust its
// descriptor table.
const MaxEntries = 4096

const maxMsg = 64 << 10

// authTimeout bounds the wait for a new connection's AUTH.
const authTimeout = 10 * time.Second

// Store holds descriptors by name. The zero value is not usable: New.
type Store struct {
	log *slog.Logger
	mu  sync.Mutex
	fds map[string]int
}

// New returns an empty store.
func New(log *slog.Logger) *Store {
	if log == nil {
		log = slog.Default()
	}
	return &Store{log: log, fds: map[string]int{}}
}

// TokenFile is the name of the token file beside the store's socket: a client must present
// what it holds (AUTH) before any request, which only a process that can read the socket's
// directory can.
const TokenFile = localsock.TokenFile

// Listen opens the store's socket at path, replacing a stale socket file of an earlier
// process. The directory is created if missing and made 0700 either way (a hostPath
// directory is created 0755), and a new token is written into it (TokenFile, 0600):
// the socket's directory is what says who may use the store.
func Listen(path string) (*net.UnixListener, error) {
	l, err := localsock.Listen("unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("fd store: %w", err)
	}
	// Closed by Serve as a plain listener: removing the socket file then is as before.
	l.SetUnlinkOnClose(true)
	return l.UnixListener, nil
}

// Serve answers requests on l, a socket Listen opened, until ctx ends; then it closes l.
// The descriptors stay held until Close. A connection must first present the token of the
// socket's directory, from a process of the store's own user (SO_PEERCRED); any other is
// refused and closed.
func (s *Store) Serve(ctx context.Context, l *net.UnixListener) error {
	token, err := localsock.Token(l.Addr().String())
	if err != nil {
		l.Close()
		return fmt.Errorf("fd store: the socket's token (was the socket opened by Listen?): %w", err)
	}
	go func() { <-ctx.Done(); l.Close() }()
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("fd store: accept: %w", err)
		}
		go s.serveConn(c, token)
	}
}

// Close closes every descriptor held.
func (s *Store) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, fd := range s.fds {
		unix.Close(fd)
		delete(s.fds, name)
	}
}

// Names lists what the store holds, sorted.
func (s *Store) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.names()
}

// names is Names for a caller holding s.mu.
func (s *Store) names() []string {
	return slices.Sorted(maps.Keys(s.fds))
}

func (s *Store) serveConn(c *net.UnixConn, token string) {
	defer c.Close()
	buf, oob := make([]byte, maxMsg), make([]byte, unix.CmsgSpace(4*8))
	if err := s.admit(c, buf, oob, token); err != nil {
		s.log.Warn("refused a client", "reason", err.Error())
		return
	}
	for {
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			return // the client went away
		}
		fds, err := localsock.Rights(oob[:oobn])
		reply, replyFD := "", -1
		if err != nil {
			reply = "ERR " + err.Error()
		} else {
			reply, replyFD = s.handle(string(buf[:n]), fds)
		}
		var rights []byte
		if replyFD >= 0 {
			rights = unix.UnixRights(replyFD)
		}
		_, _, err = c.WriteMsgUnix([]byte(reply), rights, nil)
		if replyFD >= 0 {
			unix.Close(replyFD)
		}
		if err != nil {
			return
		}
	}
}

// admit checks a new connection's peer: a process of the store's own user (SO_PEERCRED),
// whose first message is AUTH with the token. It answers OK, or ERR and why.
func (s *Store) admit(c *net.UnixConn, buf, oob []byte, token string) error {
	refuse := func(why string, args ...any) error {
		err := fmt.Errorf(why, args...)
		_, _, _ = c.WriteMsgUnix([]byte("ERR refused: "+err.Error()), nil, nil)
		return err
	}
	// A client that connects and says nothing does not keep a goroutine for good.
	_ = c.SetReadDeadline(time.Now().Add(authTimeout))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		return err
	}
	if fds, _ := localsock.Rights(oob[:oobn]); len(fds) > 0 {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	presented, _ := strings.CutPrefix(string(buf[:n]), "AUTH ")
	if err := localsock.Check(c, presented, token); err != nil {
		return refuse("%w", err)
	}
	if _, _, err := c.WriteMsgUnix([]byte("OK"), nil, nil); err != nil {
		return err
	}
	return nil
}

// handle answers one request; fds are the descriptors it came with, which handle owns.
// A descriptor to send back is a duplicate the caller closes after sending.
func (s *Store) handle(req string, fds []int) (string, int) {
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	verb, name, _ := strings.Cut(req, " ")
	if verb != "LIST" {
		if err := ValidName(name); err != nil {
			closeAll()
			return "ERR " + err.Error(), -1
		}
	}
	if verb != "PUT" && len(fds) > 0 {
		closeAll()
		return "ERR " + verb + " takes no descriptor", -1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch verb {
	case "PUT":
		if len(fds) != 1 {
			closeAll()
			return fmt.Sprintf("ERR PUT takes one descriptor, got %d", len(fds)), -1
		}
		old, had := s.fds[name]
		if !had && len(s.fds) >= MaxEntries {
			closeAll()
			return fmt.Sprintf("ERR the store is full (%d descriptors)", MaxEntries), -1
		}
		if had {
			unix.Close(old)
		}
		s.fds[name] = fds[0]
		s.log.Info("descriptor kept", "name", name, "replaced", had)
		return "OK", -1
	case "GET":
		fd, ok := s.fds[name]
		if !ok {
			return "NOTFOUND", -1
		}
		dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return "ERR dup: " + err.Error(), -1
		}
		return "OK", dup
	case "DEL":
		if fd, ok := s.fds[name]; ok {
			unix.Close(fd)
			delete(s.fds, name)
			s.log.Info("descriptor released", "name", name)
		}
		return "OK", -1
	case "LIST":
		return "OK " + strings.Join(s.names(), "\n"), -1
	}
	closeAll()
	return fmt.Sprintf("ERR unknown request %q", verb), -1
}

// ValidName says why name cannot name a descriptor: it is empty, too long, or has a space
// or a control character (the protocol separates with those).
func ValidName(name string) error {
	if name == "" || len(name) > 512 {
		return fmt.Errorf("name %q: want 1 to 512 bytes", name)
	}
	if i := strings.IndexFunc(name, func(r rune) bool { return r <= ' ' || r == 0x7f }); i >= 0 {
		return fmt.Errorf("name %q: space or control character at byte %d", name, i)
	}
	return nil
}

// DefaultSocket is where config/csi's fd holder listens on the node: in a directory of its
// own that only the holder and the CSI node plugin mount. (The holder of the commits before
// listened in the pool agent's /var/lib/crdipc; no release had it: 0.2.0 has no holder.)
const DefaultSocket = "/var/lib/crdipc-fd-holder/fd.sock"

// Client talks to the store at Path, presenting the token beside it.
type Client struct {
	Path string
	// Timeout bounds each request; zero means 5 s.
	Timeout time.Duration
}

// Put stores a duplicate of fd under name; the caller keeps fd.
func (c Client) Put(name string, fd int) error {
	_, _, err := c.do("PUT "+name, fd)
	return err
}

// Get returns a descriptor of what name holds, which the caller owns, or ErrNotFound.
func (c Client) Get(name string) (int, error) {
	_, fd, err := c.do("GET "+name, -1)
	return fd, err
}

// Delete drops what name holds; nothing held is not an error.
func (c Client) Delete(name string) error {
	_, _, err := c.do("DEL "+name, -1)
	return err
}

// List returns the names the store holds, sorted.
func (c Client) List() ([]string, error) {
	body, _, err := c.do("LIST", -1)
	if err != nil || body == "" {
		return nil, err
	}
	return strings.Split(body, "\n"), nil
}

func (c Client) do(req string, fd int) (string, int, error) {
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	path := c.Path
	token, err := localsock.Token(path)
	if err != nil {
		return "", -1, fmt.Errorf("fd store at %s: its token: %w", path, err)
	}
	conn, err := net.DialTimeout("unixpacket", path, timeout)
	if err != nil {
		return "", -1, fmt.Errorf("fd store at %s: %w", path, err)
	}
	defer conn.Close()
	uc := conn.(*net.UnixConn)
	_ = uc.SetDeadline(time.Now().Add(timeout))
	if _, _, err := uc.WriteMsgUnix([]byte("AUTH "+token), nil, nil); err != nil {
		return "", -1, fmt.Errorf("fd store at %s: %w", path, err)
	}
	abuf := make([]byte, 512)
	n, _, _, _, err := uc.ReadMsgUnix(abuf, nil)
	if err != nil {
		return "", -1, fmt.Errorf("fd store at %s: %w", path, err)
	}
	if answer := string(abuf[:n]); answer != "OK" {
		return "", -1, fmt.Errorf("fd store at %s: %s", path, strings.TrimPrefix(answer, "ERR "))
	}
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	if _, _, err := uc.WriteMsgUnix([]byte(req), oob, nil); err != nil {
		return "", -1, fmt.Errorf("fd store at %s: %w", path, err)
	}
	buf, roob := make([]byte, maxMsg), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, roob)
	if err != nil {
		return "", -1, fmt.Errorf("fd store at %s: %w", path, err)
	}
	fds, err := localsock.Rights(roob[:oobn])
	if err != nil {
		return "", -1, fmt.Errorf("fd store at %s: %w", path, err)
	}
	got := -1
	for i, f := range fds {
		if i == 0 {
			got = f
		} else {
			unix.Close(f)
		}
	}
	answer := string(buf[:n])
	verb, body, _ := strings.Cut(answer, " ")
	switch verb {
	case "OK":
		if strings.HasPrefix(req, "GET ") && got < 0 {
			return "", -1, fmt.Errorf("fd store at %s: %s: answered without a descriptor", path, req)
		}
		return body, got, nil
	case "NOTFOUND":
		if got >= 0 {
			unix.Close(got)
		}
		return "", -1, fmt.Errorf("%s: %w", strings.TrimPrefix(req, "GET "), ErrNotFound)
	}
	if got >= 0 {
		unix.Close(got)
	}
	return "", -1, fmt.Errorf("fd store at %s: %s: %s", path, req, strings.TrimPrefix(answer, "ERR "))
}
