package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"

	"github.com/google/go-github/v84/github"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	scmv1alpha1 "github.com/crdipc/crdipc/api/scm/v1alpha1"
)

// Error results, the result label of crdipc_webhook_deliveries_total for answers that are not
// 2xx.
const (
	resultMethod       = "method_not_allowed"
	resultBadRequest   = "bad_request"
	resultUnauthorized = "unauthorized"
	resultTooLarge     = "too_large"
	resultMediaType    = "unsupported_media_type"
	resultUnavailable  = "unavailable"
	resultError        = "error"
	// resultOverloaded: MaxConcurrentRequests deliveries were in flight; the body was not read.
	resultOverloaded = "overloaded"
	// resultConflict: the body or the delivery ID contradicts a Delivery record.
	resultConflict = "conflict"
)

// Retry-After of a 503, in seconds: for an unreachable API server, and for a full listener,
// which frees up as soon as the deliveries in flight are stored.
const (
	retryAfterUnavailable = "10"
	retryAfterOverloaded  = "2"
)

// maxDeliveryIDLen bounds X-GitHub-Delivery (a GUID, 36 characters) so it fits an Event name.
const maxDeliveryIDLen = 128

// response is the JSON body of every /webhook answer.
type response struct {
	status int
	// retryAfter is the Retry-After header of a 503; closeConn asks the client to close the
	// connection, because the request's body was not read.
	retryAfter string
	closeConn  bool

	Delivery string `json:"delivery,omitempty"`
	Event    string `json:"event,omitempty"`
	Result   string `json:"result"`
	// Object is <resource>/<name> of the PullRequest or Branch the delivery is recorded on.
	Object string `json:"object,omitempty"`
	// EventName is the core/v1 Event recording the delivery.
	EventName string `json:"eventName,omitempty"`
	Message   string `json:"message,omitempty"`
	Error     string `json:"error,omitempty"`
}

func fail(status int, result, format string, a ...any) *response {
	return &response{status: status, Result: result, Error: fmt.Sprintf(format, a...)}
}

func (l *Listener) serveWebhook(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	event := github.WebHookType(r)
	resp := l.handle(r)
	resp.Delivery, resp.Event = github.DeliveryID(r), event
	if len(resp.Delivery) > maxDeliveryIDLen {
		resp.Delivery = resp.Delivery[:maxDeliveryIDLen]
	}
	if resp.status == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", http.MethodPost)
	}
	if resp.status == http.StatusServiceUnavailable {
		if resp.retryAfter == "" {
			resp.retryAfter = retryAfterUnavailable
		}
		w.Header().Set("Retry-After", resp.retryAfter)
	}
	if resp.closeConn {
		// Without this, net/http would read up to 256 KiB of the unread body before sending
		// the answer, to reuse the connection; with it, the answer goes out at once and the
		// connection's slot is freed (net/http still drains at most 256 KiB after the answer,
		// so that the client can read it before the close).
		w.Header().Set("Connection", "close")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(resp.status)
	_ = json.NewEncoder(w).Encode(resp)

	l.metrics.deliveries.WithLabelValues(eventLabel(event), resp.Result).Inc()
	l.metrics.duration.WithLabelValues(resp.Result).Observe(time.Since(start).Seconds())
	attrs := []any{"delivery", resp.Delivery, "event", event, "status", resp.status, "result", resp.Result,
		"duration", time.Since(start).Round(time.Microsecond)}
	if resp.Object != "" {
		attrs = append(attrs, "object", resp.Object)
	}
	if resp.Error != "" {
		l.opts.Logger.Warn("webhook delivery refused", append(attrs, "error", resp.Error)...)
		return
	}
	l.opts.Logger.Info("webhook delivery", attrs...)
}

// handle checks a request in order of cost, so that nothing is parsed before the signature
// proves the body came from GitHub, and writes nothing unless every check passed.
func (l *Listener) handle(r *http.Request) *response {
	arrived := time.Now()
	if r.Method != http.MethodPost {
		return fail(http.StatusMethodNotAllowed, resultMethod, "method %s not allowed: GitHub delivers webhooks with POST", r.Method)
	}
	event, delivery := github.WebHookType(r), github.DeliveryID(r)
	switch {
	case event == "":
		return fail(http.StatusBadRequest, resultBadRequest, "missing X-GitHub-Event header")
	case delivery == "":
		return fail(http.StatusBadRequest, resultBadRequest, "missing X-GitHub-Delivery header")
	case len(delivery) > maxDeliveryIDLen:
		return fail(http.StatusBadRequest, resultBadRequest, "X-GitHub-Delivery is longer than %d characters", maxDeliveryIDLen)
	}
	ct := r.Header.Get("Content-Type")
	mediaType, _, err := mime.ParseMediaType(ct)
	if ct == "" || err != nil || (mediaType != "application/json" && mediaType != "application/x-www-form-urlencoded") {
		return fail(http.StatusUnsupportedMediaType, resultMediaType,
			"unsupported Content-Type %q: configure the webhook with application/json (or application/x-www-form-urlencoded)", truncate(ct, 100))
	}
	limit := l.opts.MaxBodyBytes
	if r.ContentLength > limit {
		return fail(http.StatusRequestEntityTooLarge, resultTooLarge, "body of %d bytes is over the limit of %d bytes", r.ContentLength, limit)
	}
	// Reading and verifying a body is the first work anyone on the Internet can make the
	// listener do; it is bounded, and a request over the bound costs nothing more.
	select {
	case l.inFlight <- struct{}{}:
		l.metrics.inFlight.Inc()
		defer func() {
			<-l.inFlight
			l.metrics.inFlight.Dec()
		}()
	default:
		resp := fail(http.StatusServiceUnavailable, resultOverloaded,
			"%d deliveries are in flight, the listener's limit (--max-concurrent-requests): body not read, nothing written; retry later", cap(l.inFlight))
		resp.retryAfter, resp.closeConn = retryAfterOverloaded, true
		return resp
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return fail(http.StatusBadRequest, resultBadRequest, "reading body: %v", err)
	}
	if int64(len(body)) > limit {
		return fail(http.StatusRequestEntityTooLarge, resultTooLarge, "body is over the limit of %d bytes", limit)
	}

	sig := r.Header.Get(github.SHA256SignatureHeader)
	switch {
	case sig == "" && r.Header.Get(github.SHA1SignatureHeader) != "":
		return fail(http.StatusUnauthorized, resultUnauthorized,
			"X-Hub-Signature (HMAC-SHA1) is not accepted: X-Hub-Signature-256 is required")
	case sig == "":
		return fail(http.StatusUnauthorized, resultUnauthorized,
			"missing X-Hub-Signature-256 header: configure the webhook with a secret")
	case !strings.HasPrefix(sig, "sha256="):
		// go-github also accepts sha1= and sha512= here; only HMAC-SHA256 is GitHub's header.
		return fail(http.StatusUnauthorized, resultUnauthorized, "X-Hub-Signature-256 must be sha256=<hex digest>")
	}
	// ValidateSignature compares in constant time (hmac.Equal).
	if err := github.ValidateSignature(sig, body, l.opts.Secret); err != nil {
		return fail(http.StatusUnauthorized, resultUnauthorized,
			"X-Hub-Signature-256 does not match the body (%v): check the webhook secret", err)
	}
	payload, err := github.ValidatePayloadFromBody(mediaType, bytes.NewReader(body), sig, l.opts.Secret)
	if err != nil {
		return fail(http.StatusBadRequest, resultBadRequest, "malformed %s body: %v", mediaType, err)
	}
	if len(payload) == 0 {
		return fail(http.StatusBadRequest, resultBadRequest, "empty payload (a form body needs a payload= field)")
	}
	if !json.Valid(payload) {
		var v any
		err := json.Unmarshal(payload, &v)
		return fail(http.StatusBadRequest, resultBadRequest, "malformed JSON payload: %v", err)
	}

	if trimmed := bytes.TrimLeft(payload, " \t\r\n"); len(trimmed) == 0 || trimmed[0] != '{' {
		return fail(http.StatusBadRequest, resultBadRequest, "payload is not a JSON object")
	}

	received := time.Now()
	c, resp := l.parse(event, payload, received)
	if resp != nil {
		return resp
	}
	ctx, cancel := context.WithTimeout(r.Context(), l.opts.Timeout)
	defer cancel()
	// Only a delivery that proved its origin is traced, so that nobody else can fill the
	// traces; its span starts when it arrived, to count the reading and the checks.
	ctx, span := l.opts.TracerProvider.Tracer(tracerName).Start(ctx, "delivery "+event,
		trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(arrived),
		trace.WithAttributes(attribute.String("github.event", event), attribute.String("github.delivery", delivery)))
	resp = l.record(ctx, c, RecordName(body), event, delivery, payload, received)
	span.SetAttributes(attribute.String("webhook.result", resp.Result), attribute.Int("http.response.status_code", resp.status))
	if resp.status >= http.StatusInternalServerError {
		span.SetStatus(codes.Error, resp.Error)
	}
	span.End()
	return resp
}

// tracerName is the instrumentation scope of the listener's spans.
const tracerName = "github.com/crdipc/crdipc/internal/scm/webhook"

// record writes a delivery that changes an object, guarded by the Delivery record of its
// body. The record is looked up first (in the cache), so that a body seen before writes
// nothing, whatever its headers say now; then the object and its Event are written; and the
// record is created last, complete, so that it never says done before the object and the
// Event are stored. Three writes on the happy path and no read of the API server. An attempt
// that ends before the record leaves no record, and the next delivery of the body redoes the
// idempotent writes and records it. Concurrent copies of the body meet on the Event's name
// (one Event) and then on the record's (one record).
func (l *Listener) record(ctx context.Context, c *change, name, event, delivery string, payload []byte, received time.Time) *response {
	rec, err := l.knownRecord(ctx, name)
	if err != nil {
		return apiFailure(fmt.Errorf("reading delivery record %s: %w", name, err))
	}
	if rec != nil {
		if resp := answerFromRecord(rec, event, delivery); resp != nil {
			return resp
		}
	} else {
		other, err := l.otherBody(ctx, delivery, name)
		if err != nil {
			return apiFailure(err)
		}
		if other != nil {
			return fail(http.StatusConflict, resultConflict,
				"delivery %s was received before with another body (deliveries/%s, a %q event at %s): one delivery ID names one body; nothing written",
				delivery, other.Name, other.Spec.Event, other.Spec.ReceivedAt.UTC().Format(time.RFC3339))
		}
	}
	// The body's own shape must match the event it claims to be, before anything is written:
	// a body without a record may be older than the retention, or its record not yet in the
	// cache.
	if err := checkShape(event, payload); err != nil {
		return fail(http.StatusBadRequest, resultBadRequest, "invalid %s payload: %v", event, err)
	}
	legacy := ""
	if rec != nil {
		// A pending record, left by an earlier listener, belongs to the delivery ID that
		// created it: a copy of the body under another ID completes that delivery, whose Event
		// that listener may have stored under its name.
		delivery, legacy = rec.Spec.DeliveryID, rec.Spec.DeliveryID
	}
	s, evName, err := l.store(ctx, c, name, delivery, legacy)
	if err != nil {
		return apiFailure(err)
	}
	object := c.resource() + "/" + s.obj.GetName()
	now := metav1.Now()
	want := &scmv1alpha1.Delivery{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: l.opts.Namespace,
			Labels:    map[string]string{"app.kubernetes.io/managed-by": "crdipc-webhook-listener"},
		},
		Spec: scmv1alpha1.DeliverySpec{DeliveryID: delivery, Event: event, ReceivedAt: metav1.NewTime(received)},
		Status: scmv1alpha1.DeliveryStatus{
			Result:      scmv1alpha1.DeliveryResult(s.result),
			Object:      object,
			EventName:   evName,
			CompletedAt: &now,
		},
	}
	existing, err := l.saveRecord(ctx, rec, want)
	if err != nil {
		return apiFailure(fmt.Errorf("%s and its event are stored but the record deliveries/%s is not: %w", object, name, err))
	}
	// A record this attempt did not write: of concurrent copies, the one that created the
	// Event answers what it did and the others are duplicates, whichever wrote the record.
	if existing != nil && (s.result == resultDuplicate || existing.Spec.Event != event) {
		if resp := answerFromRecord(existing, event, delivery); resp != nil {
			return resp
		}
	}
	return &response{
		status:    http.StatusOK,
		Result:    s.result,
		Object:    object,
		EventName: evName,
		Message:   c.message,
	}
}

// parse turns a verified payload into a change, or answers the delivery itself (ping,
// ignored, invalid).
func (l *Listener) parse(event string, payload []byte, received time.Time) (*change, *response) {
	switch event {
	case "ping", "pull_request", "create", "delete", "push":
	default:
		return nil, &response{status: http.StatusAccepted, Result: resultIgnored, Message: fmt.Sprintf("ignored: event %q is not handled", truncate(event, 60))}
	}
	parsed, err := github.ParseWebHook(event, payload)
	if err != nil {
		return nil, fail(http.StatusBadRequest, resultBadRequest, "payload is not a %s event: %v", event, err)
	}
	var c *change
	switch ev := parsed.(type) {
	case *github.PingEvent:
		return nil, &response{status: http.StatusOK, Result: resultPong, Message: ev.GetZen()}
	case *github.PullRequestEvent:
		c, err = pullRequestChange(ev)
	case *github.CreateEvent:
		c, err = createChange(ev, received)
	case *github.DeleteEvent:
		c, err = deleteChange(ev, received)
	case *github.PushEvent:
		c, err = pushChange(ev, received)
	default:
		return nil, fail(http.StatusInternalServerError, resultError, "unexpected parsed type %T", parsed)
	}
	var ign *ignored
	var inv *invalidPayload
	switch {
	case errors.As(err, &ign):
		return nil, &response{status: http.StatusAccepted, Result: resultIgnored, Message: ign.Error()}
	case errors.As(err, &inv):
		return nil, fail(http.StatusBadRequest, resultBadRequest, "invalid %s payload: %v", event, inv)
	case err != nil:
		return nil, fail(http.StatusBadRequest, resultBadRequest, "invalid %s payload: %v", event, err)
	}
	return c, nil
}

// apiFailure answers a failed write. Whatever the API server refuses as invalid will be
// refused again (400); a refusal of our own permissions needs an operator (500); anything
// else (unreachable, timeouts, 5xx, throttling) is worth a redelivery (503).
func apiFailure(err error) *response {
	switch {
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		return fail(http.StatusBadRequest, resultBadRequest, "the API server refused the object: %v", err)
	case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
		return fail(http.StatusInternalServerError, resultError, "the listener is not allowed to write: %v", err)
	case apierrors.IsNotFound(err):
		return fail(http.StatusInternalServerError, resultError, "namespace missing? %v", err)
	case errors.Is(err, errNamesTaken):
		return fail(http.StatusInternalServerError, resultError, "%v", err)
	}
	return fail(http.StatusServiceUnavailable, resultUnavailable, "API server unavailable, nothing acknowledged; redeliver later: %v", err)
}
