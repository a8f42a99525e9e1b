package tracing_test

import (
	"context"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/collector"
	"github.com/crdipc/crdipc/internal/testenv/wait"
	"github.com/crdipc/crdipc/internal/tracing"
)

// An endpoint given as an option (a flag) exports, over the specification's default
// protocol, http/protobuf, with no OTLP variable set; every service's spans carry
// its name.
func TestEndpointOptionExportsOverHTTP(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED"} {
		t.Setenv(k, "")
	}
	ctx := context.Background()
	c, err := collector.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	p, err := tracing.New(ctx, tracing.Options{Endpoint: "http://" + c.HTTP})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Enabled() {
		t.Fatal("provider with an endpoint is off")
	}
	_, span := p.Service("books").Tracer("test").Start(ctx, "reconcile Book")
	span.End()
	if err := p.Shutdown(ctx); err != nil { // flushes
		t.Fatal(err)
	}
	id := span.SpanContext().TraceID()
	wait.Eventually(t, 10*time.Second, "the collector to receive the span", func(context.Context) (bool, error) {
		got := c.Spans(func(s collector.Span) bool { return s.TraceID == id })
		return len(got) == 1 && got[0].Service == "books" && got[0].Name == "reconcile Book", nil
	})
}
