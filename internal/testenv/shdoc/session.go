package shdoc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// Session is one bash that runs commands in turn, as one terminal does. It runs with
// errexit and pipefail: a command that fails ends the session, as it would end a script,
// and Run reports it with what the session printed.
type Session struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser

	mu     sync.Mutex
	out    strings.Builder // everything the session and its background jobs printed
	marks  map[int]chan int
	next   int
	exited chan struct{}
	err    error // of the bash process, once exited is closed
}

const marker = "__shdoc_done_"

// Start starts bash in dir, with env added to this process's environment. Its process
// group is its own, so that Close also ends the background jobs its commands started.
func Start(dir string, env []string) (*Session, error) {
	cmd := exec.Command("bash", "--noprofile", "--norc")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("starting bash: %w", err)
	}
	pw.Close() // the session and its jobs hold the write end now
	s := &Session{cmd: cmd, stdin: stdin, marks: map[int]chan int{}, exited: make(chan struct{})}
	go s.read(pr)
	go func() {
		s.err = cmd.Wait()
		close(s.exited)
	}()
	if _, err := io.WriteString(stdin, "set -eo pipefail\n"); err != nil {
		_ = s.Close(0)
		return nil, err
	}
	return s, nil
}

// read keeps what the session prints and signals each command's end marker.
func (s *Session) read(r io.ReadCloser) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	lastEmpty := false
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, marker); ok {
			n, rc, found := strings.Cut(rest, " ")
			id, err1 := strconv.Atoi(n)
			code, err2 := strconv.Atoi(rc)
			if found && err1 == nil && err2 == nil {
				s.mu.Lock()
				// The marker's leading newline made an empty line after output that
				// ended in one: it is not the command's.
				if lastEmpty {
					out := s.out.String()
					s.out.Reset()
					s.out.WriteString(out[:len(out)-1])
				}
				lastEmpty = false
				if ch := s.marks[id]; ch != nil {
					ch <- code
				}
				s.mu.Unlock()
				continue
			}
		}
		s.mu.Lock()
		s.out.WriteString(line + "\n")
		lastEmpty = line == ""
		s.mu.Unlock()
	}
}

// Run pastes command into the session and waits until it ends or ctx does. It returns
// what the session printed meanwhile (background jobs' output included).
func (s *Session) Run(ctx context.Context, command string) (string, error) {
	s.mu.Lock()
	id := s.next
	s.next++
	done := make(chan int, 1)
	s.marks[id] = done
	start := s.out.Len()
	s.mu.Unlock()
	// The marker's newline first: the command's last line may have none.
	script := fmt.Sprintf("%s\nprintf '\\n%s%d %%d\\n' \"$?\"\n", command, marker, id)
	if _, err := io.WriteString(s.stdin, script); err != nil {
		return s.since(start), fmt.Errorf("writing to the session: %w", err)
	}
	select {
	case <-done:
		return s.since(start), nil
	case <-s.exited:
		return s.since(start), fmt.Errorf("the command failed, ending the session (%v)", s.err)
	case <-ctx.Done():
		return s.since(start), fmt.Errorf("the command did not end: %w", ctx.Err())
	}
}

func (s *Session) since(start int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()[start:]
}

// Output is everything the session printed so far.
func (s *Session) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

// Alive reports whether the session still runs (a failed command ends it).
func (s *Session) Alive() bool {
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// Close ends the session and every process of its group (background jobs too): SIGTERM,
// as a terminal's hangup would, and SIGKILL for what has not ended within grace.
func (s *Session) Close(grace time.Duration) error {
	s.stdin.Close()
	pgid := s.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	<-s.exited
	gone := func(context.Context) (bool, error) {
		return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH), nil
	}
	if wait.Until(context.Background(), grace, gone) == nil {
		return nil
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("killing the session's jobs: %w", err)
	}
	return nil
}
