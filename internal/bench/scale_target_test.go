package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// targetServer serves this process's metrics as a manager does: the process and Go
// collectors, over HTTP.
func targetServer(t *testing.T) string {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

// The target's figures are the process's own: read here both ways, they agree.
func TestScrapeTargetProcess(t *testing.T) {
	url := targetServer(t)
	ctx := context.Background()
	m, err := scrapeMemory(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	rss, _, _ := procStatus()
	if m.RSSBytes < rss/2 || m.RSSBytes > rss*2 || m.HeapBytes == 0 || m.HeapInuseBytes == 0 || m.StackBytes == 0 || m.Goroutines == 0 {
		t.Errorf("scraped %+v; this process's RSS is %d", m, rss)
	}

	// CPU: a spinning goroutine during the window, counted by the kernel both ways.
	var stop atomic.Bool
	go func() {
		for !stop.Load() {
		}
	}()
	defer stop.Store(true)
	c0, err := processCPU()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	cores, err := scrapeIdleCPU(ctx, url, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	c1, err := processCPU()
	if err != nil {
		t.Fatal(err)
	}
	used, wall := (c1 - c0).Seconds(), time.Since(t0).Seconds()
	// process_cpu_seconds_total counts in the kernel's 10 ms ticks; the scrapes themselves
	// fall just inside or outside the window.
	if got := cores * wall; got <= 0 || got < used-0.05 || got > used+0.05 {
		t.Errorf("scraped %.3f cores over %.2f s = %.3f s of CPU; getrusage says %.3f s", cores, wall, got, used)
	}
}

// A URL that is not a Go process's metrics is an error that says what is missing.
func TestScrapeTargetWithoutProcessMetrics(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("# TYPE up gauge\nup 1\n"))
	}))
	defer srv.Close()
	_, err := scrapeMemory(context.Background(), srv.URL)
	if err == nil || !strings.Contains(err.Error(), "process_resident_memory_bytes") {
		t.Fatalf("err = %v, want one naming the missing series", err)
	}
	_, err = scrapeMemory(context.Background(), srv.URL+"/nothing-listens-here\x7f")
	if err == nil {
		t.Fatal("a malformed URL was accepted")
	}
}
