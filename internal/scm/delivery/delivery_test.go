package delivery

import (
	"context"
	"net/http"
	"testing"

	"github.com/google/go-github/v84/github"
)

// GitHub's own example ("Validating webhook deliveries"), and go-github's validation of a
// built request: what the listener checks.
func TestSignedAsGitHubSigns(t *testing.T) {
	const want = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
	if got := Sign([]byte("It's a Secret to Everybody"), []byte("Hello, World!")); got != want {
		t.Fatalf("Sign = %s, want GitHub's %s", got, want)
	}
	secret, body := []byte("s3cret"), []byte(`{"zen":"Keep it logically awesome."}`)
	req, err := New(context.Background(), "http://127.0.0.1/webhook", secret, "ping", "d-1", body)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := github.ValidatePayload(req, secret)
	if err != nil {
		t.Fatalf("go-github refuses the delivery: %v", err)
	}
	if string(payload) != string(body) || github.WebHookType(req) != "ping" || github.DeliveryID(req) != "d-1" {
		t.Errorf("payload %q, event %q, delivery %q", payload, github.WebHookType(req), github.DeliveryID(req))
	}
	if _, err := github.ValidatePayload(mustNew(t, []byte("other"), body), secret); err == nil {
		t.Error("a delivery signed with another secret validates")
	}
}

func mustNew(t *testing.T, secret, body []byte) *http.Request {
	t.Helper()
	req, err := New(context.Background(), "http://127.0.0.1/webhook", secret, "ping", "d-2", body)
	if err != nil {
		t.Fatal(err)
	}
	return req
}
