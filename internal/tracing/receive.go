package tracing

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// MaxOTLPBodyBytes bounds one OTLP export request the Store accepts, after
// decompression.
const MaxOTLPBodyBytes = 8 << 20

// OTLPHandler receives OTLP/HTTP trace exports (POST of an
// ExportTraceServiceRequest in binary protobuf, optionally gzipped, as
// the OpenTelemetry SDKs send them to <endpoint>/v1/traces) into the store,
// so that the spans of other processes join a trace the store keeps: those
// of `crdipc call`, or of a service run on its own and pointed at up with
// OTEL_EXPORTER_OTLP_ENDPOINT. A request it cannot read is answered 4xx with
// the reason, and nothing of it is kept.
func (s *Store) OTLPHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "OTLP export is a POST", http.StatusMethodNotAllowed)
			return
		}
		// Binary protobuf, what the SDKs send for http/protobuf (the default protocol).
		// OTLP's JSON encoding writes IDs in hex where protojson expects base64, so it is
		// not taken rather than read wrong.
		if mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mediaType != "application/x-protobuf" {
			http.Error(w, fmt.Sprintf("unsupported Content-Type %q: want application/x-protobuf (OTLP/HTTP binary protobuf)", mediaType), http.StatusUnsupportedMediaType)
			return
		}
		body := io.Reader(http.MaxBytesReader(w, r.Body, MaxOTLPBodyBytes))
		switch r.Header.Get("Content-Encoding") {
		case "", "identity":
		case "gzip":
			zr, err := gzip.NewReader(body)
			if err != nil {
				http.Error(w, "reading gzip body: "+err.Error(), http.StatusBadRequest)
				return
			}
			defer zr.Close()
			body = io.LimitReader(zr, MaxOTLPBodyBytes+1)
		default:
			http.Error(w, fmt.Sprintf("unsupported Content-Encoding %q: want gzip or none", r.Header.Get("Content-Encoding")), http.StatusUnsupportedMediaType)
			return
		}
		data, err := io.ReadAll(body)
		if err != nil || len(data) > MaxOTLPBodyBytes {
			http.Error(w, fmt.Sprintf("reading body (at most %d bytes): %v", MaxOTLPBodyBytes, err), http.StatusRequestEntityTooLarge)
			return
		}
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(data, &req); err != nil {
			http.Error(w, "decoding ExportTraceServiceRequest: "+err.Error(), http.StatusBadRequest)
			return
		}
		spans, err := fromOTLP(&req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, sp := range spans {
			s.add(sp)
		}
		resp, err := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(resp)
	})
}

// fromOTLP converts an export request's spans; a span with an invalid trace
// or span ID fails the whole request.
func fromOTLP(req *coltracepb.ExportTraceServiceRequest) ([]Span, error) {
	var out []Span
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = anyString(kv.GetValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, ps := range ss.GetSpans() {
				sp, err := fromOTLPSpan(ps)
				if err != nil {
					return nil, err
				}
				sp.Service = service
				out = append(out, sp)
			}
		}
	}
	return out, nil
}

func fromOTLPSpan(ps *tracepb.Span) (Span, error) {
	var sp Span
	if len(ps.GetTraceId()) != len(sp.TraceID) || len(ps.GetSpanId()) != len(sp.SpanID) {
		return Span{}, fmt.Errorf("span %q: trace ID %s and span ID %s: want 16 and 8 bytes", ps.GetName(), hex.EncodeToString(ps.GetTraceId()), hex.EncodeToString(ps.GetSpanId()))
	}
	copy(sp.TraceID[:], ps.GetTraceId())
	copy(sp.SpanID[:], ps.GetSpanId())
	if !sp.TraceID.IsValid() || !sp.SpanID.IsValid() {
		return Span{}, fmt.Errorf("span %q: an all-zero trace or span ID", ps.GetName())
	}
	if len(ps.GetParentSpanId()) == len(sp.Parent) {
		copy(sp.Parent[:], ps.GetParentSpanId())
	}
	sp.Name = ps.GetName()
	// The OTLP and OpenTelemetry API span kinds share their numbering.
	sp.Kind = trace.SpanKind(ps.GetKind())
	sp.Start = time.Unix(0, int64(ps.GetStartTimeUnixNano()))
	sp.End = time.Unix(0, int64(ps.GetEndTimeUnixNano()))
	for _, l := range ps.GetLinks() {
		var cfg trace.SpanContextConfig
		if len(l.GetTraceId()) == len(cfg.TraceID) && len(l.GetSpanId()) == len(cfg.SpanID) {
			copy(cfg.TraceID[:], l.GetTraceId())
			copy(cfg.SpanID[:], l.GetSpanId())
			sp.Links = append(sp.Links, trace.NewSpanContext(cfg))
		}
	}
	if attrs := ps.GetAttributes(); len(attrs) > 0 {
		sp.Attributes = make(map[string]string, len(attrs))
		for _, kv := range attrs {
			sp.Attributes[kv.GetKey()] = anyString(kv.GetValue())
		}
	}
	if ps.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		sp.Failed, sp.Error = true, ps.GetStatus().GetMessage()
	}
	return sp, nil
}

// anyString is an attribute value in its string form, as the SDK's
// attribute.Value.Emit writes the scalar ones.
func anyString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		return strconv.FormatBool(x.BoolValue)
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_DoubleValue:
		return strconv.FormatFloat(x.DoubleValue, 'g', -1, 64)
	case nil:
		return ""
	}
	b, _ := protojson.Marshal(v)
	return string(b)
}
