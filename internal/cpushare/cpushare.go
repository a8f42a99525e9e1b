package cpushare

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"runtime/pprof"
	"time"

	"github.com/google/pprof/profile"
)

// Label is the pprof label whose value names the component a goroutine belongs to.
const Label = "crdipc.component"

// Unattributed is the share of goroutines without Label: the Go runtime's, and those of
// code that was not started under Do.
const Unattributed = "unattributed"

// Do runs f in this goroutine under the label of component name; every goroutine f starts
// keeps it, and so do theirs. The goroutine's labels are restored when f returns.
func Do(name string, f func()) {
	pprof.Do(context.Background(), pprof.Labels(Label, name), func(context.Context) { f() })
}

// Shares is the CPU the process used during a window, by component.
type Shares struct {
	Window time.Duration
	Cores  Cores
}

// Cores is each component's CPU time over a window, in cores; goroutines without a
// component are under Unattributed. Components that were not sampled are absent.
type Cores map[string]float64

// Total is the process's CPU over the window, in cores, as the profiler sampled it.
func (c Cores) Total() float64 {
	var t float64
	for _, v := range c {
		t += v
	}
	return t
}

// Measure runs the CPU profiler for d and returns the process's CPU by component. The
// profiler samples at 100 Hz, so a share is known to about 10 ms of CPU over the window.
// Only one CPU profile can run in a process at a time: Measure fails while another does
// (such as `crdipc bench --cpu-profile`).
func Measure(ctx context.Context, d time.Duration) (Shares, error) {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		return Shares{}, fmt.Errorf("sampling CPU by component: %w", err)
	}
	t0 := time.Now()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
	pprof.StopCPUProfile()
	window := time.Since(t0)
	if err := ctx.Err(); err != nil {
		return Shares{}, err
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		return Shares{}, fmt.Errorf("reading the CPU profile: %w", err)
	}
	return sharesOf(p, window)
}

// sharesOf adds up the profile's CPU time by the samples' component label.
func sharesOf(p *profile.Profile, window time.Duration) (Shares, error) {
	cpu := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" && st.Unit == "nanoseconds" {
			cpu = i
		}
	}
	if cpu < 0 {
		return Shares{}, fmt.Errorf("the CPU profile has no cpu/nanoseconds samples (types %v)", p.SampleType)
	}
	s := Shares{Window: window, Cores: Cores{}}
	for _, sample := range p.Sample {
		name := Unattributed
		if v := sample.Label[Label]; len(v) > 0 {
			name = cmp.Or(v[0], Unattributed)
		}
		s.Cores[name] += float64(sample.Value[cpu]) / float64(window.Nanoseconds())
	}
	return s, nil
}
