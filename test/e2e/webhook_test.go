package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/crdipc/crdipc/internal/scm/delivery"
)

// newWebhookSender reads the webhook address up printed and the secret it keeps in dataDir.
func newWebhookSender(t *testing.T, up *upProcess, dataDir string) webhookSender {
	t.Helper()
	m := regexp.MustCompile(`webhook\s+(http://\S+/webhook)`).FindStringSubmatch(up.Output.String())
	if m == nil {
		t.Fatalf("up did not print the webhook address:\n%s", up.Output.String())
	}
	secret, err := os.ReadFile(filepath.Join(dataDir, "webhook-secret"))
	if err != nil {
		t.Fatalf("up did not write the webhook secret: %v", err)
	}
	return webhookSender{url: m[1], secret: bytes.TrimSpace(secret)}
}

// webhookSender sends deliveries to up's listener, as GitHub does.
type webhookSender struct {
	url    string
	secret []byte
}

// send posts testdata fixture as event with delivery id, signed, and checks the status.
func (h webhookSender) send(t *testing.T, event, fixture, id string, status int) {
	t.Helper()
	body, err := os.ReadFile(filepath.Join("../../internal/scm/webhook/testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	h.post(t, h.secret, event, id, body, status)
}

// forged posts a delivery signed with another secret: refused, 401.
func (h webhookSender) forged(t *testing.T, id string) {
	t.Helper()
	h.post(t, []byte("not the secret"), "ping", id, []byte(`{"zen":"forged"}`), http.StatusUnauthorized)
}

func (h webhookSender) post(t *testing.T, secret []byte, event, id string, body []byte, status int) {
	t.Helper()
	req, err := delivery.New(context.Background(), h.url, secret, event, id, body)
	if err != nil {
		t.Fatal(err)
	}
	h.do(t, req, status)
}

// get sends a GET: refused, 405.
func (h webhookSender) get(t *testing.T, status int) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, h.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.do(t, req, status)
}

func (h webhookSender) do(t *testing.T, req *http.Request, status int) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != status {
		t.Fatalf("%s %s (%s, delivery %q) answered %d, want %d: %s", req.Method, req.URL,
			req.Header.Get("X-GitHub-Event"), req.Header.Get("X-GitHub-Delivery"), resp.StatusCode, status, b)
	}
}
