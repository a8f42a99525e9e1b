package tracing

import (
	"context"
	"fmt"
	"net"
	"sync"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/otel/trace"
)

// span is a span as the collector received it.
type span struct {
	traceID trace.TraceID
	spanID  trace.SpanID
	parent  trace.SpanID
	service string
	name    string
	kind    ptrace.SpanKind
	attrs   map[string]string
}

func (s span) String() string {
	return fmt.Sprintf("%s/%q (%s, span %s, parent %s)", s.service, s.name, s.kind, s.spanID, s.parent)
}

// collector is the OpenTelemetry Collector's OTLP receiver (gRPC) on a
// loopback port, keeping every span it receives.
type collector struct {
	endpoint string // host:port
	stop     func(context.Context) error

	mu    sync.Mutex
	spans []span
}

func startCollector(ctx context.Context) (*collector, error) {
	addr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	c := &collector{endpoint: addr}
	sink, err := consumer.NewTraces(c.consume)
	if err != nil {
		return nil, err
	}
	factory := otlpreceiver.NewFactory()
	cfg := factory.CreateDefaultConfig().(*otlpreceiver.Config)
	cfg.Protocols.GRPC.GetOrInsertDefault().NetAddr.Endpoint = addr
	cfg.Protocols.HTTP = configoptional.None[otlpreceiver.HTTPConfig]()
	r, err := factory.CreateTraces(ctx, receivertest.NewNopSettings(factory.Type()), cfg, sink)
	if err != nil {
		return nil, fmt.Errorf("creating OTLP receiver: %w", err)
	}
	if err := r.Start(ctx, componenttest.NewNopHost()); err != nil {
		return nil, fmt.Errorf("starting OTLP receiver: %w", err)
	}
	c.stop = r.Shutdown
	return c, nil
}

// freeLoopbackAddr is a loopback port free a moment ago: the receiver takes
// an address, not a listener, and does not say which port :0 chose.
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (c *collector) consume(_ context.Context, td ptrace.Traces) error {
	var got []span
	for _, rs := range td.ResourceSpans().All() {
		service := ""
		if v, ok := rs.Resource().Attributes().Get("service.name"); ok {
			service = v.AsString()
		}
		for _, ss := range rs.ScopeSpans().All() {
			for _, s := range ss.Spans().All() {
				attrs := map[string]string{}
				for k, v := range s.Attributes().All() {
					attrs[k] = v.AsString()
				}
				got = append(got, span{
					traceID: trace.TraceID(s.TraceID()),
					spanID:  trace.SpanID(s.SpanID()),
					parent:  trace.SpanID(s.ParentSpanID()),
					service: service,
					name:    s.Name(),
					kind:    s.Kind(),
					attrs:   attrs,
				})
			}
		}
	}
	c.mu.Lock()
	c.spans = append(c.spans, got...)
	c.mu.Unlock()
	return nil
}

// matching returns the spans received so far for which keep holds.
func (c *collector) matching(keep func(span) bool) []span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []span
	for _, s := range c.spans {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}
