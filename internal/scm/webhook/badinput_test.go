package webhook_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/hex"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/crdipc/crdipc/internal/scm/delivery"
	"github.com/crdipc/crdipc/internal/scm/webhook"
	"github.com/crdipc/crdipc/internal/testenv"
)

func sha1Sig(secret string, body []byte) string {
	m := hmac.New(sha1.New, []byte(secret))
	m.Write(body)
	return "sha1=" + hex.EncodeToString(m.Sum(nil))
}

// Every bad input gets its status and a reason, and writes nothing.
func TestBadInput(t *testing.T) {
	const limit = 20 << 10
	h := newHarness(t, nil, func(o *webhook.Options) { o.MaxBodyBytes = limit })
	opened := fixture(t, "pull_request-opened.json")
	replace := func(old, new string) []byte { return bytes.Replace(opened, []byte(old), []byte(new), 1) }
	big := append(append([]byte(`{"zen":"`), bytes.Repeat([]byte("a"), limit)...), []byte(`"}`)...)

	cases := []struct {
		name   string
		req    func() *http.Request
		status int
		reason string
	}{
		{"GET", func() *http.Request {
			r := h.request("pull_request", "x", opened)
			r.Method = http.MethodGet
			return r
		}, 405, "GitHub delivers webhooks with POST"},
		{"no event header", func() *http.Request {
			r := h.request("pull_request", "x", opened)
			r.Header.Del("X-GitHub-Event")
			return r
		}, 400, "missing X-GitHub-Event"},
		{"no delivery header", func() *http.Request {
			r := h.request("pull_request", "x", opened)
			r.Header.Del("X-GitHub-Delivery")
			return r
		}, 400, "missing X-GitHub-Delivery"},
		{"delivery too long", func() *http.Request {
			return h.request("pull_request", strings.Repeat("d", 129), opened)
		}, 400, "longer than 128"},
		{"text/plain", func() *http.Request {
			r := h.request("pull_request", "x", opened)
			r.Header.Set("Content-Type", "text/plain")
			return r
		}, 415, `unsupported Content-Type "text/plain"`},
		{"no content type", func() *http.Request {
			r := h.request("pull_request", "x", opened)
			r.Header.Del("Content-Type")
			return r
		}, 415, "unsupported Content-Type"},
		{"too large (Content-Length)", func() *http.Request { return h.request("ping", "x", big) }, 413, "over the limit"},
		{"too large (chunked)", func() *http.Request {
			r := h.request("ping", "x", big)
			r.Body = io.NopCloser(bytes.NewReader(big)) // hides the length: sent chunked
			r.ContentLength = -1
			return r
		}, 413, "over the limit"},
		{"no signature", func() *http.Request {
			r := h.request("pull_request", "x", opened)
			r.Header.Del("X-Hub-Signature-256")
			return r
		}, 401, "missing X-Hub-Signature-256"},
		{"SHA-1 signature only", func() *http.Request {
			r := h.request("pull_request", "x", opened)
			r.Header.Del("X-Hub-Signature-256")
			r.Header.Set("X-Hub-Signature", sha1Sig(testSecret, opened))
			return r
		}, 401, "HMAC-SHA1) is not accepted"},
		{"sha1 digest in the SHA-256 header", func() *http.Request {
			r := h.request("pull_request", "x", opened)
			r.Header.Set("X-Hub-Signature-256", sha1Sig(testSecret, opened))
			return r
		}, 401, "must be sha256="},
		{"wrong secret", func() *http.Request {
			r := h.request("pull_request", "x", opened)
			r.Header.Set("X-Hub-Signature-256", delivery.Sign([]byte("not the secret"), opened))
			return r
		}, 401, "does not match the body"},
		{"body changed after signing", func() *http.Request {
			r := h.request("pull_request", "x", opened)
			tampered := replace(`"login": "mona"`, `"login": "eve"`)
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(tampered)), int64(len(tampered))
			return r
		}, 401, "does not match the body"},
		{"signature not hex", func() *http.Request {
			r := h.request("pull_request", "x", opened)
			r.Header.Set("X-Hub-Signature-256", "sha256=zz")
			return r
		}, 401, "does not match the body"},
		{"malformed JSON", func() *http.Request { return h.request("pull_request", "x", opened[:len(opened)/2]) }, 400, "malformed JSON"},
		{"form without payload", func() *http.Request {
			body := []byte("foo=bar")
			r := h.request("pull_request", "x", body)
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			return r
		}, 400, "payload= field"},
		{"wrong type for a field", func() *http.Request {
			return h.request("pull_request", "x", replace(`"number": 42,`, `"number": "forty-two",`))
		}, 400, "payload is not a pull_request event"},
		{"no updated_at", func() *http.Request {
			return h.request("pull_request", "x", replace(`"updated_at": "2026-03-02T10:06:00Z"`, `"updated_at": null`))
		}, 400, "pull_request.updated_at is missing"},
		{"no pull_request", func() *http.Request {
			return h.request("pull_request", "x", []byte(`{"action":"opened","number":1}`))
		}, 400, "pull_request is missing"},
		{"bad head sha", func() *http.Request {
			return h.request("pull_request", "x", replace(`"sha": "c4f1e0f8a3c0b4f2a6b9b9e0c2d3e4f5a6b7c8d9"`, `"sha": "C4F1"`))
		}, 400, "not a 40-character lowercase hex"},
		{"bad repository", func() *http.Request {
			return h.request("pull_request", "x", bytes.ReplaceAll(opened, []byte(`"full_name": "octo-org/hello-world"`), []byte(`"full_name": "no slash here"`)))
		}, 400, "is not owner/name"},
		{"bad state", func() *http.Request {
			return h.request("pull_request", "x", replace(`"state": "open"`, `"state": "draft"`))
		}, 400, "neither open nor closed"},
		{"push without ref", func() *http.Request {
			return h.request("push", "x", bytes.Replace(fixture(t, "push.json"), []byte(`"ref": "refs/heads/feature/login"`), []byte(`"ref": ""`), 1))
		}, 400, "ref is missing"},
		{"create without ref_type", func() *http.Request {
			return h.request("create", "x", bytes.Replace(fixture(t, "create-branch.json"), []byte(`"ref_type": "branch"`), []byte(`"ref_type": ""`), 1))
		}, 202, "ref_type is missing"},
		{"JSON array", func() *http.Request { return h.request("push", "x", []byte(`[1,2,3]`)) }, 400, "payload is not a JSON object"},
		{"JSON null", func() *http.Request { return h.request("delete", "x", []byte(`null`)) }, 400, "payload is not a JSON object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(tc.req())
			msg := r.Error
			if msg == "" {
				msg = r.Message
			}
			if r.Status != tc.status || !strings.Contains(msg, tc.reason) {
				t.Errorf("got %d %q, want %d with %q", r.Status, msg, tc.status, tc.reason)
			}
			if c := h.counts(); c != [3]int{} {
				t.Errorf("bad input wrote objects: %v", c)
			}
		})
	}
}

// GitHub's other content type: the JSON in a payload= form field, signed over the form body.
func TestFormEncoded(t *testing.T) {
	h := newHarness(t, nil)
	body := []byte("payload=" + url.QueryEscape(string(fixture(t, "pull_request-opened.json"))))
	r := h.request("pull_request", deliveryA, body)
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if got := h.do(r); got.Status != 200 || got.Result != "created" || got.Object != "pullrequests/"+pr42 {
		t.Fatalf("form-encoded delivery: %d %+v", got.Status, got)
	}
}

func TestBodyLimitFlagBounds(t *testing.T) {
	cfg := testenv.Get(t).Config
	for _, n := range []int64{-1, webhook.MaxMaxBodyBytes + 1} {
		if _, err := webhook.New(webhook.Options{Config: cfg, Namespace: "default", Secret: []byte("x"), MaxBodyBytes: n}); err == nil {
			t.Errorf("MaxBodyBytes %d accepted", n)
		}
	}
}
