package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// A cluster measured through --kubeconfig is served by another process, crdipc up as a
// rule: its memory and CPU are read from its Prometheus /metrics (the process and Go
// collectors every controller-runtime manager registers), parsed by Prometheus' parser.

// targetSample is what one scrape of the target says.
type targetSample struct {
	// memory: what the target's runtime alone can say (peak RSS, mapped files, RSS with
	// free pages released) is left zero, and its heap is what is allocated, garbage not
	// yet collected included: bench cannot make another process collect first.
	memory     ScaleMemory
	cpuSeconds float64
}

// scrapeProcess reads one targetSample from url.
func scrapeProcess(ctx context.Context, url string) (targetSample, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return targetSample{}, fmt.Errorf("target metrics: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return targetSample{}, fmt.Errorf("target metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return targetSample{}, fmt.Errorf("target metrics: GET %s: %s", url, resp.Status)
	}
	families, err := parseMetrics(resp.Body)
	if err != nil {
		return targetSample{}, fmt.Errorf("target metrics: %s: %w", url, err)
	}
	var missing []string
	get := func(name string) float64 {
		mf := families[name]
		if mf == nil || len(mf.GetMetric()) != 1 {
			missing = append(missing, name)
			return 0
		}
		return value(mf.GetMetric()[0])
	}
	sample := targetSample{
		memory: ScaleMemory{
			RSSBytes:       uint64(get("process_resident_memory_bytes")),
			HeapBytes:      uint64(get("go_memstats_heap_alloc_bytes")),
			HeapInuseBytes: uint64(get("go_memstats_heap_inuse_bytes")),
			StackBytes:     uint64(get("go_memstats_stack_inuse_bytes")),
			Goroutines:     int(get("go_goroutines")),
		},
		cpuSeconds: get("process_cpu_seconds_total"),
	}
	if len(missing) > 0 {
		return targetSample{}, fmt.Errorf("target metrics: %s has no single series %s (is it a Go process with the process collector, such as crdipc up's --metrics-addr?)", url, strings.Join(missing, ", "))
	}
	return sample, nil
}

// parseMetrics parses a /metrics answer in Prometheus' text format, with Prometheus' own
// parser, into its families by name.
func parseMetrics(r io.Reader) (map[string]*dto.MetricFamily, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return families, nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	default:
		return m.GetUntyped().GetValue()
	}
}

// scrapeMemory is readMemory for the target (see targetSample.memory).
func scrapeMemory(ctx context.Context, url string) (ScaleMemory, error) {
	sample, err := scrapeProcess(ctx, url)
	return sample.memory, err
}

// scrapeIdleCPU is the target's CPU during d, in cores, from its process_cpu_seconds_total
// (user and system time, to the 10 ms the kernel counts in).
func scrapeIdleCPU(ctx context.Context, url string, d time.Duration) (float64, error) {
	before, err := scrapeProcess(ctx, url)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(d):
	}
	after, err := scrapeProcess(ctx, url)
	if err != nil {
		return 0, err
	}
	return (after.cpuSeconds - before.cpuSeconds) / time.Since(t0).Seconds(), nil
}
