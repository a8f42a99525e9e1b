package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"k8s.io/client-go/rest"
)

// APIServerService is the service.name of the embedded kube-apiserver's
// spans, the name kube-apiserver gives itself.
const APIServerService = "kube-apiserver"

// Options say where spans go. The zero value exports where the environment
// says, if it says anything, and keeps no store.
type Options struct {
	// Endpoint is the base URL of an OTLP receiver, as in
	// OTEL_EXPORTER_OTLP_ENDPOINT: http://localhost:4318, to which HTTP
	// export adds /v1/traces, or http://localhost:4317 with
	// OTEL_EXPORTER_OTLP_PROTOCOL=grpc. It turns export on and takes
	// precedence over the endpoint variables: a flag's value.
	Endpoint string
	// Store, when set, keeps the recent traces in memory.
	Store *Store
	// Receivers are more OTLP/HTTP receivers (base URLs) that get every span, whatever
	// the environment says: up's console, for `crdipc call --trace`. Sent without
	// retries: a receiver that is not there loses the spans and holds nothing up.
	Receivers []string
}

// Provider hands out the tracer providers of one process's services. Its
// methods are safe for concurrent use.
type Provider struct {
	processors []sdktrace.SpanProcessor // shared by every service's provider; nil when off

	mu       sync.Mutex
	services map[string]*sdktrace.TracerProvider
}

// New builds the span processors that o and the environment ask for. With
// none, or with OTEL_SDK_DISABLED=true, the Provider is off and everything it
// returns is a no-op. Shutdown
// flushes and stops it.
func New(ctx context.Context, o Options) (*Provider, error) {
	p := &Provider{services: map[string]*sdktrace.TracerProvider{}}
	if sdkDisabled() {
		// The specification's switch for the whole SDK: no store, no receivers either.
		return p, nil
	}
	if exportOn(o.Endpoint) {
		exp, err := newExporter(ctx, o.Endpoint)
		if err != nil {
			return nil, err
		}
		p.processors = append(p.processors, sdktrace.NewBatchSpanProcessor(exp))
	}
	if o.Store != nil {
		p.processors = append(p.processors, o.Store)
	}
	for _, r := range o.Receivers {
		u, err := tracesURL(r)
		if err != nil {
			return nil, err
		}
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(u),
			otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}), otlptracehttp.WithTimeout(2*time.Second))
		if err != nil {
			return nil, fmt.Errorf("creating OTLP exporter for %s: %w", r, err)
		}
		p.processors = append(p.processors, sdktrace.NewBatchSpanProcessor(exp))
	}
	return p, nil
}

// tracesURL is the traces URL of an OTLP/HTTP base URL, as the specification
// derives it from OTEL_EXPORTER_OTLP_ENDPOINT.
func tracesURL(base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("OTLP endpoint: %w", err)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	return u.String(), nil
}

// Enabled reports whether spans go anywhere. A nil Provider is off.
func (p *Provider) Enabled() bool { return p != nil && len(p.processors) > 0 }

// Service returns the tracer provider of the named service (its
// service.name). The sampler is OTEL_TRACES_SAMPLER's, by default parent
// based and always on: a span starts a trace unless it continues one, whose
// decision it then follows.
func (p *Provider) Service(name string) trace.TracerProvider {
	return p.service(name, nil)
}

// APIServer returns the tracer provider for the embedded kube-apiserver. It
// samples only requests that arrive in a sampled trace, as kube-apiserver
// does by default (samplingRatePerMillion 0): the API server serves far more
// requests (watches, leases, its own loopback) than any trace is about.
//
// kube-apiserver makes a request's span a child of the caller's only for
// system:masters (and system:monitoring) clients; for other users it starts a
// new trace that links to the caller's (k8s.io/apiserver's WithTracing, a
// public endpoint). This provider makes that span the caller's child too
// (adoptCaller): every client of the embedded API server is one of the
// process's own services, whose writes belong in the request's trace.
func (p *Provider) APIServer() trace.TracerProvider {
	if !p.Enabled() {
		return noop.NewTracerProvider()
	}
	return adoptCaller{p.service(APIServerService, sdktrace.ParentBased(sdktrace.NeverSample()))}
}

func (p *Provider) service(name string, sampler sdktrace.Sampler) trace.TracerProvider {
	if !p.Enabled() {
		return noop.NewTracerProvider()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if tp, ok := p.services[name]; ok {
		return tp
	}
	// resource.Default carries the SDK and OTEL_RESOURCE_ATTRIBUTES; the service name
	// is ours, since one process runs several services under `up`.
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(name)))
	if err != nil {
		res = resource.NewSchemaless(semconv.ServiceName(name))
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if sampler != nil {
		opts = append(opts, sdktrace.WithSampler(sampler))
	}
	for _, sp := range p.processors {
		// Each service's provider would shut the shared processors down with itself.
		opts = append(opts, sdktrace.WithSpanProcessor(shared{sp}))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	p.services[name] = tp
	return tp
}

// RESTConfig returns cfg with a transport that carries the trace of each
// request's context to the API server in the traceparent header, in a client
// span of the named service. Requests made outside a trace (informers'
// lists and watches, lease renewals) get no span: they would each start a
// trace of their own. With tracing off, cfg is returned as is.
func (p *Provider) RESTConfig(cfg *rest.Config, service string) *rest.Config {
	if !p.Enabled() {
		return cfg
	}
	cfg = rest.CopyConfig(cfg)
	tp := p.Service(service)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return otelhttp.NewTransport(rt,
			otelhttp.WithTracerProvider(tp),
			otelhttp.WithPropagators(propagation.TraceContext{}),
			otelhttp.WithFilter(func(r *http.Request) bool {
				return trace.SpanContextFromContext(r.Context()).IsValid()
			}),
		)
	})
	return cfg
}

// ForceFlush exports the spans that have ended and are still queued.
func (p *Provider) ForceFlush(ctx context.Context) error {
	if p == nil {
		return nil
	}
	var errs []error
	for _, sp := range p.processors {
		errs = append(errs, sp.ForceFlush(ctx))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("flushing spans: %w", err)
	}
	return nil
}

// Shutdown flushes the spans still queued and stops export. Spans that end
// afterwards are dropped.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	services := p.services
	p.services = map[string]*sdktrace.TracerProvider{}
	p.mu.Unlock()
	var errs []error
	for _, tp := range services {
		errs = append(errs, tp.Shutdown(ctx))
	}
	for _, sp := range p.processors {
		errs = append(errs, sp.Shutdown(ctx))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("shutting down tracing: %w", err)
	}
	return nil
}

// ShutdownWithin is Shutdown bounded by d, from a context of its own: it runs as a
// process stops, when the caller's context is often done already, and a collector that
// is gone must not hold the exit up for long.
func (p *Provider) ShutdownWithin(d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return p.Shutdown(ctx)
}

// shared is a span processor of several tracer providers: the Provider, not
// each of them, shuts it down.
type shared struct{ sdktrace.SpanProcessor }

func (shared) Shutdown(context.Context) error { return nil }

// exportOn says whether spans are exported: when an endpoint is given here or
// in the environment, or OTEL_TRACES_EXPORTER asks for otlp, unless the
// environment turns the SDK or trace export off. The exporters' own default,
// localhost, is not reason enough: most runs have no collector.
func exportOn(endpoint string) bool {
	switch exporter := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); exporter {
	case "none":
		return false
	case "otlp":
		return true
	}
	return endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
}

// sdkDisabled says whether OTEL_SDK_DISABLED turns tracing off altogether.
func sdkDisabled() bool { return strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") }

// newExporter is the OTLP exporter for the protocol the environment names
// (http/protobuf by default, as the specification says), configured by the
// environment and, when set, endpoint.
func newExporter(ctx context.Context, endpoint string) (sdktrace.SpanExporter, error) {
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch protocol {
	case "grpc":
		var opts []otlptracegrpc.Option
		if endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(endpoint))
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	case "", "http/protobuf":
		var opts []otlptracehttp.Option
		if endpoint != "" {
			// The exporter takes a signal's URL (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT's form);
			// a base URL names the traces path as the specification says.
			u, err := tracesURL(endpoint)
			if err != nil {
				return nil, err
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(u))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	default:
		return nil, fmt.Errorf("OTLP protocol %q: want grpc or http/protobuf", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("creating OTLP exporter: %w", err)
	}
	return exp, nil
}

// ChildOnly returns tp restricted to spans that continue a trace: a span
// started where ctx carries no span context is not started at all (the
// returned context is ctx, the span a no-op). For instrumentation that wraps
// every call of a client or a server (gRPC's stats handlers), of which only
// those made for a request belong in a trace: probes, health checks and
// calls from tools outside crdipc would each start a trace of their own.
func ChildOnly(tp trace.TracerProvider) trace.TracerProvider { return childOnly{tp} }

type childOnly struct{ trace.TracerProvider }

func (p childOnly) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return childOnlyTracer{p.TracerProvider.Tracer(name, opts...)}
}

type childOnlyTracer struct{ trace.Tracer }

func (t childOnlyTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, trace.SpanFromContext(ctx)
	}
	return t.Tracer.Start(ctx, name, opts...)
}
