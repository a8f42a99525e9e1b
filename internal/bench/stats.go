package bench

import (
	"slices"
	"time"
)

// QuantileStep is the spacing, in percent, of Latencies.Quantiles: they are the 0th, 5th,
// 10th, … 100th percentiles (min to max), QuantileCount values.
const (
	QuantileStep  = 5
	QuantileCount = 100/QuantileStep + 1
)

// QuantilePercent is the percentile that Latencies.Quantiles[i] holds.
func QuantilePercent(i int) float64 { return float64(i * QuantileStep) }

// Latencies summarises a sample of durations.
type Latencies struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50Ms"`
	P99 float64 `json:"p99Ms"`
	Max float64 `json:"maxMs"`
	// Quantiles is the distribution, for plots: the percentiles 0, 5, 10, … 100 (ms), see
	// QuantilePercent. Absent from results written before it existed.
	Quantiles []float64 `json:"quantilesMs,omitempty"`
}

// summarize takes percentile p of n sorted samples at index ⌊p·(n-1)⌋: nearest rank from
// below, the same rule for P50, P99 and every Quantile.
func summarize(d []time.Duration) Latencies {
	if len(d) == 0 {
		return Latencies{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	q := func(p float64) float64 {
		i := int(p * float64(len(s)-1))
		return ms(s[i])
	}
	l := Latencies{N: len(s), P50: q(0.50), P99: q(0.99), Max: ms(s[len(s)-1]), Quantiles: make([]float64, QuantileCount)}
	for i := range l.Quantiles {
		// In integers: p·(n-1) with p = i/20 in floating point is off by one ulp at times.
		l.Quantiles[i] = ms(s[i*QuantileStep*(len(s)-1)/100])
	}
	return l
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
