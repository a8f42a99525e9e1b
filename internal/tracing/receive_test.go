package tracing_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/crdipc/crdipc/internal/tracing"
)

// The official OTLP/HTTP exporter, gzipped as it can be configured, delivers a process's
// spans into the store: names, parents, kinds, attributes, status and service as sent.
func TestOTLPHandlerTakesTheSDKExportersSpans(t *testing.T) {
	store := tracing.NewStore(10, 0)
	mux := http.NewServeMux()
	mux.Handle("/v1/traces", store.OTLPHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(srv.URL+"/v1/traces"), otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("crdipc-call"))))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, call := tp.Tracer("test").Start(context.Background(), "call Book", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("ipc.name", "dune"), attribute.Int64("ipc.generation", 2)))
	_, post := tp.Tracer("test").Start(ctx, "HTTP POST")
	post.SetStatus(codes.Error, "conflict")
	post.End()
	call.End()

	spans, dropped := store.Trace(call.SpanContext().TraceID())
	if len(spans) != 2 || dropped != 0 {
		t.Fatalf("store holds %d spans (%d dropped) of the trace, want 2", len(spans), dropped)
	}
	c, p := spans[0], spans[1]
	if c.Name != "call Book" || c.Service != "crdipc-call" || c.Kind != trace.SpanKindClient || c.Parent.IsValid() ||
		c.SpanID != call.SpanContext().SpanID() || c.Attributes["ipc.name"] != "dune" || c.Attributes["ipc.generation"] != "2" || c.Duration() <= 0 {
		t.Errorf("call span stored as %+v", c)
	}
	if p.Name != "HTTP POST" || p.Parent != c.SpanID || !p.Failed || p.Error != "conflict" {
		t.Errorf("child span stored as %+v", p)
	}
}

func TestOTLPHandlerRefusesWhatItCannotRead(t *testing.T) {
	store := tracing.NewStore(10, 0)
	srv := httptest.NewServer(store.OTLPHandler())
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		name, method, contentType, body string
		want                            int
		reason                          string
	}{
		{"GET", http.MethodGet, "application/json", "", http.StatusMethodNotAllowed, "POST"},
		{"text", http.MethodPost, "text/plain", "spans", http.StatusUnsupportedMediaType, "application/x-protobuf"},
		{"JSON", http.MethodPost, "application/json", "{}", http.StatusUnsupportedMediaType, "application/x-protobuf"},
		{"not protobuf", http.MethodPost, "application/x-protobuf", "\xff\xff\xff", http.StatusBadRequest, "decoding"},
		{"short trace ID", http.MethodPost, "application/x-protobuf", shortTraceID(t), http.StatusBadRequest, "16 and 8 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, srv.URL, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", tc.contentType)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var msg strings.Builder
			_, _ = io.Copy(&msg, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want || !strings.Contains(msg.String(), tc.reason) {
				t.Errorf("answered %d %q, want %d naming %q", resp.StatusCode, msg.String(), tc.want, tc.reason)
			}
		})
	}
	if got := store.Recent(); len(got) != 0 {
		t.Errorf("store holds traces %v after refused requests", got)
	}
}

// shortTraceID is an export request whose one span has a 2-byte trace ID.
func shortTraceID(t *testing.T) string {
	b, err := proto.Marshal(&coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{{TraceId: []byte{1, 2}, SpanId: []byte{1, 2, 3, 4, 5, 6, 7, 8}, Name: "x"}}}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
