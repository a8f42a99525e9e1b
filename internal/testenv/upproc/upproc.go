package upproc

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/kubectl"
	"github.com/crdipc/crdipc/internal/testenv/syncbuf"
)

// exportPrefix starts the line up prints once it serves: what a user pastes into a shell.
const exportPrefix = "export KUBECONFIG="

// How long up has to get ready, and to exit after Ctrl-C, before the test gives up on it.
const (
	readyTimeout = 2 * time.Minute
	stopTimeout  = 30 * time.Second
)

// Options say what to run.
type Options struct {
	// Binary is the crdipc binary; Args its arguments ("up", ...).
	Binary string
	Args   []string
	// Dir is its working directory ("": the test's).
	Dir string
	// Env ("NAME=value") is added to its environment and to that of every command run on it
	// (the Client's Env), as variables exported in the user's shell are.
	Env []string
}

// Process is a running `crdipc up`, and kubectl on its cluster.
type Process struct {
	*kubectl.Client
	Cmd *exec.Cmd
	// Output is what up printed, stdout and stderr.
	Output *syncbuf.Buffer
	exited chan error // holds Wait's result once the process ended
	// racesChecked: Stop reports up's data races once, though the cleanup stops it again.
	racesChecked bool
}

// Start runs o.Binary o.Args... and returns once it printed its export line; it fails t
// when the process exits first or takes longer than 2 minutes. The test's cleanup stops it.
func Start(t testing.TB, o Options) *Process {
	t.Helper()
	cmd := exec.Command(o.Binary, o.Args...)
	cmd.Dir = o.Dir
	cmd.Env = append(os.Environ(), o.Env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// stderr is copied by exec's goroutine while the scanner below writes stdout's lines:
	// the buffer takes both.
	out := &syncbuf.Buffer{}
	cmd.Stderr = out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Process{Cmd: cmd, Output: out, exited: make(chan error, 1)}
	p.Client = &kubectl.Client{
		Env:   o.Env,
		State: func() string { return "crdipc up:\n" + kubectl.Tail(out.String(), 30) + "\n" },
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			_, _ = out.WriteString(line + "\n")
			if k, ok := strings.CutPrefix(line, exportPrefix); ok {
				select {
				case found <- k:
				default: // printed again: the first one counts
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		p.exited <- cmd.Wait()
	}()
	t.Cleanup(func() { p.Stop(t) })
	select {
	case p.Kubeconfig = <-found:
	case err := <-p.exited:
		p.exited <- err
		t.Fatalf("crdipc up exited before it was ready: %v\n%s", err, out.String())
	case <-time.After(readyTimeout):
		t.Fatalf("crdipc up not ready after %v:\n%s", readyTimeout, out.String())
	}
	return p
}

// GoBuildFlags are the go build flags for the crdipc binary a test runs: -race when the test
// itself runs under the race detector (make test-race), so that the races looked for are
// also those of up's services, in up's process.
func GoBuildFlags() []string {
	if raceEnabled {
		return []string{"-race"}
	}
	return nil
}

// raceReport is how the race detector starts each report it prints.
const raceReport = "WARNING: DATA RACE"

// checkRaces fails t for each data race up's race detector reported.
func (p *Process) checkRaces(t testing.TB) {
	t.Helper()
	if p.racesChecked {
		return
	}
	p.racesChecked = true
	out := p.Output.String()
	if n := strings.Count(out, raceReport); n > 0 {
		i := strings.Index(out, raceReport)
		t.Errorf("crdipc up reported %d data race(s); the first:\n%s", n, kubectl.Tail(out[i:], 200))
	}
}

// Stop sends Ctrl-C and returns how long the process took to exit; it fails t when the
// process exits with an error, or is still running 30 s later (then it is killed). A
// process that ended already takes 0.
func (p *Process) Stop(t testing.TB) time.Duration {
	t.Helper()
	defer p.checkRaces(t)
	select {
	case err := <-p.exited:
		p.exited <- err
		return 0
	default:
	}
	start := time.Now()
	_ = p.Cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-p.exited:
		p.exited <- err
		if err != nil {
			t.Errorf("crdipc up exited with %v after Ctrl-C:\n%s", err, kubectl.Tail(p.Output.String(), 60))
		}
	case <-time.After(stopTimeout):
		_ = p.Cmd.Process.Kill()
		t.Errorf("crdipc up still running %v after Ctrl-C: killed", stopTimeout)
	}
	return time.Since(start)
}

// Exited says whether the process has ended, and with what.
func (p *Process) Exited() (bool, error) {
	select {
	case err := <-p.exited:
		p.exited <- err
		return true, err
	default:
		return false, nil
	}
}
