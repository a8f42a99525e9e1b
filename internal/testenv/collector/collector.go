package collector

import (
	"context"
	"fmt"
	"net"
	"sync"

	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/otel/trace"
)

// Span is a span as the collector received it.
type Span struct {
	TraceID    trace.TraceID
	SpanID     trace.SpanID
	Parent     trace.SpanID
	Service    string // the resource's service.name
	Name       string
	Kind       ptrace.SpanKind
	Attributes map[string]string
}

func (s Span) String() string {
	return fmt.Sprintf("%s/%q (%s, span %s, parent %s)", s.Service, s.Name, s.Kind, s.SpanID, s.Parent)
}

// Collector is a running OTLP receiver.
type Collector struct {
	// GRPC and HTTP are the receiver's host:port for each protocol.
	GRPC, HTTP string

	stop  func(context.Context) error
	mu    sync.Mutex
	spans []Span
}

// Start starts a receiver on two loopback ports. Stop it with Stop.
func Start(ctx context.Context) (*Collector, error) {
	grpcAddr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	httpAddr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	c := &Collector{GRPC: grpcAddr, HTTP: httpAddr}
	sink, err := consumer.NewTraces(c.consume)
	if err != nil {
		return nil, err
	}
	factory := otlpreceiver.NewFactory()
	cfg := factory.CreateDefaultConfig().(*otlpreceiver.Config)
	cfg.Protocols.GRPC.GetOrInsertDefault().NetAddr.Endpoint = grpcAddr
	cfg.Protocols.HTTP.GetOrInsertDefault().ServerConfig.NetAddr.Endpoint = httpAddr
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

// Stop stops the receiver.
func (c *Collector) Stop(ctx context.Context) error { return c.stop(ctx) }

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

func (c *Collector) consume(_ context.Context, td ptrace.Traces) error {
	var got []Span
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
				got = append(got, Span{
					TraceID:    trace.TraceID(s.TraceID()),
					SpanID:     trace.SpanID(s.SpanID()),
					Parent:     trace.SpanID(s.ParentSpanID()),
					Service:    service,
					Name:       s.Name(),
					Kind:       s.Kind(),
					Attributes: attrs,
				})
			}
		}
	}
	c.mu.Lock()
	c.spans = append(c.spans, got...)
	c.mu.Unlock()
	return nil
}

// Spans returns the spans received so far for which keep holds.
func (c *Collector) Spans(keep func(Span) bool) []Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Span
	for _, s := range c.spans {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}
