package webhook_test

import (
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
)

// FuzzWebhook sends signed arbitrary bodies under each handled event type to the listener,
// writing to the real API server. Whatever the body, the answer is one of the documented
// statuses with a reason, and a refused delivery writes nothing. The seed corpus (every
// fixture) runs in plain `go test`. To fuzz, use one worker (each worker process would start
// its own control plane): go test -run '^$' -fuzz FuzzWebhook -parallel 1 ./internal/scm/webhook
func FuzzWebhook(f *testing.F) {
	entries, err := os.ReadDir("testdata")
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		body, err := os.ReadFile("testdata/" + e.Name())
		if err != nil {
			f.Fatal(err)
		}
		event, _, _ := strings.Cut(strings.TrimSuffix(e.Name(), ".json"), "-")
		f.Add(event, body)
	}
	f.Add("pull_request", []byte(`{"action":"opened","pull_request":{"number":1}}`))
	f.Add("push", []byte(`{"ref":"refs/heads/`+strings.Repeat("x", 300)+`"}`))
	f.Add("create", []byte(`{}`))
	f.Add("delete", []byte(`null`))
	f.Add("ping", []byte("\xff\xfe"))

	h := newHarness(f, nil)
	delivery := 0
	f.Fuzz(func(t *testing.T, event string, body []byte) {
		if strings.ContainsFunc(event, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return // not a value an HTTP client can send in a header: nothing to check
		}
		delivery++
		h.t = t
		before := h.counts()
		r := h.deliver(event, "fuzz-"+strconv.Itoa(delivery), body)
		switch r.Status {
		case http.StatusOK, http.StatusAccepted:
			if r.Result == "" {
				t.Fatalf("%d without a result: %+v", r.Status, r)
			}
		case http.StatusBadRequest, http.StatusConflict, http.StatusUnsupportedMediaType, http.StatusRequestEntityTooLarge:
			if r.Error == "" {
				t.Fatalf("%d without a reason: %+v", r.Status, r)
			}
			if after := h.counts(); after != before {
				t.Fatalf("refused delivery (%d %s) wrote objects: %v → %v", r.Status, r.Error, before, after)
			}
		default:
			t.Fatalf("unexpected status %d: %+v", r.Status, r)
		}
	})
}
