package bench

import (
	"slices"
	"time"
)

// Latencies summarises a sample of durations.
type Latencies struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50Ms"`
	P99 float64 `json:"p99Ms"`
	Max float64 `json:"maxMs"`
}

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
	return Latencies{N: len(s), P50: q(0.50), P99: q(0.99), Max: ms(s[len(s)-1])}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
