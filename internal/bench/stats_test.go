package bench

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestSummarizeQuantiles checks the distribution against samples whose percentiles are
// known: 1 … 101 ms, shuffled, so the p-th percentile is p+1 ms.
func TestSummarizeQuantiles(t *testing.T) {
	d := make([]time.Duration, 101)
	for i := range d {
		d[i] = time.Duration(i+1) * time.Millisecond
	}
	rand.Shuffle(len(d), func(i, j int) { d[i], d[j] = d[j], d[i] })
	l := summarize(d)
	if l.N != 101 || l.P50 != 51 || l.P99 != 100 || l.Max != 101 {
		t.Errorf("summary %+v, want n 101, p50 51, p99 100, max 101", l)
	}
	if len(l.Quantiles) != QuantileCount || QuantileCount != 21 {
		t.Fatalf("%d quantiles (QuantileCount %d), want 21", len(l.Quantiles), QuantileCount)
	}
	for i, q := range l.Quantiles {
		if want := QuantilePercent(i) + 1; q != want {
			t.Errorf("quantile %d (p%.0f) = %v ms, want %v", i, QuantilePercent(i), q, want)
		}
	}
	if l.Quantiles[10] != l.P50 || l.Quantiles[20] != l.Max {
		t.Errorf("p50 %v and max %v disagree with quantiles %v", l.P50, l.Max, l.Quantiles)
	}

	// Samples fewer than quantiles: every quantile is one of them, in order.
	l = summarize([]time.Duration{3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond})
	if l.Quantiles[0] != 1 || l.Quantiles[10] != 2 || l.Quantiles[19] != 2 || l.Quantiles[20] != 3 {
		t.Errorf("three samples: quantiles %v", l.Quantiles)
	}
	for i := 1; i < len(l.Quantiles); i++ {
		if l.Quantiles[i] < l.Quantiles[i-1] {
			t.Errorf("quantiles not ascending: %v", l.Quantiles)
		}
	}

	if l := summarize(nil); l.N != 0 || l.Quantiles != nil {
		t.Errorf("no samples: %+v, want the zero summary", l)
	}
}
