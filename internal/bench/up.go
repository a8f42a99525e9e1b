package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// UpGoalSeconds is the goal for a start of `crdipc up` from a fresh data dir.
const UpGoalSeconds = 2.5

// UpOptions configure MeasureUp.
type UpOptions struct {
	// Binary is the crdipc binary to start; default this process's own executable.
	Binary string
	// Starts is how many measured starts, each from a fresh data dir; default 5.
	Starts int
	// Warmup starts run first and are not measured: the first start after a build reads
	// the binary from disk.
	Warmup int
	// Args follow "up"; none: the README's command, `crdipc up`, with its defaults.
	Args []string
	// Timeout bounds one start, until it says it is up, and its stop; default 2 min.
	Timeout time.Duration
	// Progress, if set, is told of each start as it ends.
	Progress func(format string, a ...any)
}

// DefaultUpOptions are the measurement: five starts after one warm-up.
var DefaultUpOptions = UpOptions{Starts: 5, Warmup: 1, Timeout: 2 * time.Minute}

// Up is the measurement of `crdipc up` starts.
type Up struct {
	Args   []string  `json:"args"`
	Starts []UpStart `json:"starts"`
	// MedianSeconds is the median of the starts' Seconds (of the two middle ones, the
	// mean, for an even count).
	MedianSeconds float64 `json:"medianSeconds"`
	GoalSeconds   float64 `json:"goalSeconds"`
}

// UpStart is one start as `up` reported it.
type UpStart struct {
	// Seconds is "crdipc is up in … s": from the command's start until every service is
	// ready.
	Seconds float64 `json:"seconds"`
	// Phases are the steps up printed, in order (certificates, etcd, kube-apiserver
	// serving, CRDs, …, services).
	Phases []UpPhase `json:"phases"`
	// StopSeconds is how long up took to stop after an interrupt, as it reported it.
	StopSeconds float64 `json:"stopSeconds"`
}

// UpPhase is one step of a start.
type UpPhase struct {
	Name string  `json:"name"`
	Ms   float64 `json:"ms"`
}

// PhaseNames are the phases of all starts, in the order up ran them.
func (u *Up) PhaseNames() []string {
	var names []string
	for _, s := range u.Starts {
		for _, p := range s.Phases {
			if !slices.Contains(names, p.Name) {
				names = append(names, p.Name)
			}
		}
	}
	return names
}

// PhaseMs is how long this start's phase name took; ok is false if it had no such phase.
func (s UpStart) PhaseMs(name string) (ms float64, ok bool) {
	for _, p := range s.Phases {
		if p.Name == name {
			return p.Ms, true
		}
	}
	return 0, false
}

// MeasureUp starts `crdipc up` o.Warmup + o.Starts times, each in a fresh temporary
// directory with the default data dir (.crdipc), waits until it says it is up, interrupts
// it as Ctrl-C would and waits until it has stopped. A start that fails, or does not say
// it is up within o.Timeout, ends the measurement with its output.
func MeasureUp(ctx context.Context, o UpOptions) (*Up, error) {
	if o.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("finding the crdipc binary: %w", err)
		}
		o.Binary = exe
	}
	if o.Starts <= 0 {
		o.Starts = DefaultUpOptions.Starts
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultUpOptions.Timeout
	}
	u := &Up{Args: append([]string{"up"}, o.Args...), GoalSeconds: UpGoalSeconds}
	for i := range o.Warmup + o.Starts {
		s, err := startUp(ctx, o)
		if err != nil {
			return nil, fmt.Errorf("start %d of up: %w", i+1, err)
		}
		if i < o.Warmup {
			if o.Progress != nil {
				o.Progress("warm-up start: up in %.2f s (not counted)", s.Seconds)
			}
			continue
		}
		u.Starts = append(u.Starts, *s)
		if o.Progress != nil {
			o.Progress("start %d of %d: up in %.2f s", len(u.Starts), o.Starts, s.Seconds)
		}
	}
	secs := make([]float64, len(u.Starts))
	for i, s := range u.Starts {
		secs[i] = s.Seconds
	}
	slices.Sort(secs)
	n := len(secs)
	u.MedianSeconds = (secs[(n-1)/2] + secs[n/2]) / 2
	return u, nil
}

// startUp runs one start of up in a fresh directory.
func startUp(ctx context.Context, o UpOptions) (*UpStart, error) {
	dir, err := os.MkdirTemp("", "crdipc-bench-up-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, o.Binary, append([]string{"up"}, o.Args...)...)
	cmd.Dir = dir
	// Its own process group: what up starts (pods as processes) goes with it on a timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	// stdout and stderr share one pipe, read by one goroutine: out is read only once that
	// goroutine is done.
	var out bytes.Buffer
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	up, read := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(read)
		// Every line is kept (for an error); the start is over once up says so.
		sc := bufio.NewScanner(io.TeeReader(stdout, &out))
		said := false
		for sc.Scan() {
			if !said && strings.HasPrefix(sc.Text(), upLinePrefix) {
				said = true
				close(up)
			}
		}
	}()
	select {
	case <-up:
	case <-read: // up ended before it was up
		err := cmd.Wait()
		return nil, fmt.Errorf("up exited (%v) before it was up; its output:\n%s", err, out.String())
	case <-ctx.Done():
		<-read
		_ = cmd.Wait()
		return nil, fmt.Errorf("not up within %v; its output:\n%s", o.Timeout, out.String())
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		return nil, err
	}
	<-read // Wait closes the pipe: everything up printed is read first
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("up did not stop cleanly after an interrupt: %w; its output:\n%s", err, out.String())
	}
	s, err := ParseUpOutput(out.String())
	if err != nil {
		return nil, fmt.Errorf("%w; its output:\n%s", err, out.String())
	}
	return s, nil
}

const upLinePrefix = "crdipc is up in "

var (
	upPhaseLine = regexp.MustCompile(`^  (\S.*?)\s+(\d+) ms$`)
	upLine      = regexp.MustCompile(`^crdipc is up in ([0-9.]+) s`)
	upStopLine  = regexp.MustCompile(`^stopped in ([0-9.]+) s$`)
)

// ParseUpOutput reads the start `crdipc up` printed: its phases ("  <name>  <n> ms", up to
// the line saying it is up; a phase named "services: a, b, …" is "services"), the seconds
// on "crdipc is up in … s" and, if it was stopped, those on "stopped in … s".
func ParseUpOutput(out string) (*UpStart, error) {
	s := &UpStart{}
	isUp := false
	for line := range strings.Lines(out) {
		line = strings.TrimRight(line, "\n")
		if m := upLine.FindStringSubmatch(line); m != nil {
			v, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				return nil, fmt.Errorf("reading %q: %w", line, err)
			}
			s.Seconds, isUp = v, true
			continue
		}
		if m := upStopLine.FindStringSubmatch(line); m != nil {
			s.StopSeconds, _ = strconv.ParseFloat(m[1], 64)
			continue
		}
		if isUp {
			continue
		}
		if m := upPhaseLine.FindStringSubmatch(line); m != nil {
			v, _ := strconv.ParseFloat(m[2], 64)
			name, _, _ := strings.Cut(m[1], ":")
			s.Phases = append(s.Phases, UpPhase{Name: strings.TrimSpace(name), Ms: v})
		}
	}
	if !isUp {
		return nil, errors.New("up never said it was up")
	}
	return s, nil
}
