package localsock

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crdipc/crdipc/internal/unixsocket"
)

// TokenFile is the name of the token file beside a socket.
const TokenFile = "token"

// maxPath is the longest socket path the kernel takes (sun_path holds 108 bytes with the
// terminating NUL).
const maxPath = len(unix.RawSockaddrUnix{}.Path) - 1

// maxLine bounds a handshake line: "AUTH " and 64 hex digits, or an answer.
const maxLine = 512

// Listener is a socket Listen opened. Its Close removes the socket file only while it is
// still its own (unixsocket): a successor (the next agent of a rollout) may have bound its
// own there meanwhile.
type Listener struct {
	*unixsocket.Listener
	// Token is what a client must present.
	Token string
}

// Listen opens a socket of network ("unix" or "unixpacket") at path, replacing a stale
// socket file of an earlier process. The directory is created if missing and made 0700
// either way (a hostPath directory is created 0755), and a new token is written into it:
// the socket's directory is what says who may use it.
func Listen(network, path string) (*Listener, error) {
	if len(path) > maxPath {
		return nil, fmt.Errorf("socket path %s is %d bytes, longer than the %d a Unix socket allows", path, len(path), maxPath)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	token, err := writeToken(dir)
	if err != nil {
		return nil, err
	}
	l, err := unixsocket.ListenNetwork(network, path)
	if err != nil {
		return nil, err
	}
	return &Listener{Listener: l, Token: token}, nil
}

// writeToken replaces dir's token with a new random one, atomically: a client reading it
// meanwhile gets the old or the new one, never a part.
func writeToken(dir string) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("token: %w", err)
	}
	token := hex.EncodeToString(b)
	f, err := os.CreateTemp(dir, "."+TokenFile+"-")
	if err != nil {
		return "", fmt.Errorf("token: %w", err)
	}
	_, err = f.WriteString(token)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, TokenFile))
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("token: %w", err)
	}
	return token, nil
}

// Token reads the token beside the socket at path.
func Token(path string) (string, error) {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(path), TokenFile))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// PeerCred is the connecting process's credentials, as the kernel recorded them at connect.
func PeerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	if cerr != nil {
		return nil, fmt.Errorf("peer credentials: %w", cerr)
	}
	return cred, nil
}

// Check says why c's peer, which presented the token presented, may not use the socket
// whose token is token: it is no process of this one's user, or the token is not it. Nil
// admits it.
func Check(c *net.UnixConn, presented, token string) error {
	cred, err := PeerCred(c)
	if err != nil {
		return err
	}
	if want := uint32(os.Geteuid()); cred.Uid != want {
		return fmt.Errorf("peer pid %d has uid %d, not the listener's %d", cred.Pid, cred.Uid, want)
	}
	if token == "" || subtle.ConstantTimeCompare([]byte(presented), []byte(token)) != 1 {
		return fmt.Errorf("peer pid %d did not present the token of the socket's directory", cred.Pid)
	}
	return nil
}

// Admit reads the first line of stream connection c, AUTH and the token, within timeout,
// and checks it as Check does. It answers "OK hello" and returns nil, or answers why not and
// returns that. Nothing of c is read past the line.
func Admit(c *net.UnixConn, token, hello string, timeout time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	line, err := readLine(c)
	if err != nil {
		return fmt.Errorf("reading the client's AUTH: %w", err)
	}
	presented, ok := strings.CutPrefix(line, "AUTH ")
	if !ok {
		presented = ""
	}
	if err := Check(c, presented, token); err != nil {
		_, _ = c.Write([]byte("ERR refused: " + err.Error() + "\n"))
		return err
	}
	if _, err := c.Write([]byte("OK " + hello + "\n")); err != nil {
		return err
	}
	return nil
}

// Dial connects to the stream socket at path, presents the token beside it and returns the
// connection and what the listener says of itself (hello). ctx bounds the whole handshake.
func Dial(ctx context.Context, path string) (*net.UnixConn, string, error) {
	token, err := Token(path)
	if err != nil {
		return nil, "", fmt.Errorf("the token of %s: %w", path, err)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, "", err
	}
	c := nc.(*net.UnixConn)
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	hello, err := func() (string, error) {
		if _, err := c.Write([]byte("AUTH " + token + "\n")); err != nil {
			return "", err
		}
		answer, err := readLine(c)
		if err != nil {
			return "", err
		}
		hello, ok := strings.CutPrefix(answer, "OK ")
		if !ok {
			return "", errors.New(strings.TrimPrefix(answer, "ERR "))
		}
		return hello, nil
	}()
	stop()
	_ = c.SetDeadline(time.Time{})
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		c.Close()
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	return c, hello, nil
}

// readLine reads one line, a byte at a time: what follows it belongs to the protocol the
// line admits, which the caller reads.
func readLine(c net.Conn) (string, error) {
	var line []byte
	b := make([]byte, 1)
	for len(line) < maxLine {
		if _, err := c.Read(b); err != nil {
			return "", err
		}
		if b[0] == '\n' {
			return string(line), nil
		}
		line = append(line, b[0])
	}
	return "", fmt.Errorf("a handshake line longer than %d bytes", maxLine)
}

// Rights returns the descriptors of the SCM_RIGHTS messages in oob, the control data of a
// message read from a Unix socket, each made close-on-exec.
func Rights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("control message: %w", err)
	}
	var fds []int
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		for _, fd := range got {
			unix.CloseOnExec(fd)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}
