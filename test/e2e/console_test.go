package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/crdipc/crdipc/internal/bitcoin/btcd"
	"github.com/crdipc/crdipc/internal/testenv/require"
	"github.com/crdipc/crdipc/internal/testenv/syncbuf"
)

// TestConsole opens up's console in a real headless Chromium, creates objects with kubectl
// and waits for the page — without a reload — to show them as they change: a volume's
// replicas on their pools and nodes, a Book completed with its latency, a webhook delivery.
// With CRDIPC_CONSOLE_SCREENSHOT=<file.png> it also applies every sample (and, with btcd,
// waits for the Bitcoin network) and saves a screenshot of the page: docs/console.png.
func TestConsole(t *testing.T) {
	requireKubectl(t)
	chromium := findChromium(t)
	dataDir := t.TempDir()
	up := startUp(t, dataDir, "--console-addr", "127.0.0.1:0")
	console := consoleURL(t, up)
	page := openBrowser(t, chromium, 1360, 900)
	if err := chromedp.Do(page.ctx, chromedp.Navigate(console)); err != nil {
		t.Fatalf("opening %s: %v\n%s", console, err, page.log.String())
	}
	page.waitFor(t, "the page to connect and list up's 3 nodes", time.Minute,
		`document.getElementById('conn').textContent === 'live' && document.querySelectorAll('[data-node]').length === 3`)
	// A reload would drop this: every later update must arrive over the event stream.
	page.eval(t, `window.crdipcConsoleTest = 'same page'; true`)

	up.Kubectl(t, "apply", "-f", "../../config/samples/csi/storage_v1alpha1_storagepoolclaim.yaml")
	page.waitFor(t, "a Healthy pool on each node", time.Minute,
		`document.querySelectorAll('[data-pool^="sample-claim-node-"] > div > .phase.ok').length === 3`)

	up.Kubectl(t, "apply", "-f", "../../config/samples/storage_v1alpha1_cstorvolume.yaml")
	page.waitFor(t, "the volume's 3 replicas Healthy, one under each node's pool", time.Minute, `(() => {
		const rs = [...document.querySelectorAll('[data-replica^="default/sample-volume-"][data-phase="Healthy"]')];
		return rs.length === 3 && new Set(rs.map((r) => r.closest('[data-node]').dataset.node)).size === 3;
	})()`)
	page.waitFor(t, "the volume Healthy 3/3", time.Minute, `(() => {
		const v = document.querySelector('[data-volume="default/sample-volume"]');
		return v !== null && v.dataset.phase === 'Healthy' && v.querySelector('.replicas').textContent === '3/3';
	})()`)
	page.waitFor(t, "the volume among the completions, with a latency", 30*time.Second,
		`/\d/.test(document.querySelector('[data-completion="CStorVolume/default/sample-volume"] .latency')?.textContent ?? '')`)

	up.Kubectl(t, "apply", "-f", "../../config/samples/library_v1alpha1_book.yaml")
	page.waitFor(t, "the Book completed, Succeeded, with a latency measured by the console", 30*time.Second, `(() => {
		const r = document.querySelector('[data-completion="Book/default/david-copperfield"]');
		return r !== null && r.textContent.includes('Succeeded') && Number(r.dataset.latencyMs) >= 0 &&
			/^\d+(\.\d+)? (ms|s)$/.test(r.querySelector('.latency').textContent);
	})()`)

	traceWaterfall(t, up, page, console)

	delivery := "0f6a4a2e-5c1d-4e7b-9f0e-3b8c2d1a9e57"
	newWebhookSender(t, up, dataDir).send(t, "pull_request", "pull_request-opened.json", delivery, http.StatusOK)
	page.waitFor(t, "the webhook delivery", 30*time.Second,
		fmt.Sprintf(`document.querySelector('[data-delivery=%q]')?.textContent.includes('PullRequestOpened') ?? false`, delivery))

	if got := page.eval(t, `window.crdipcConsoleTest === 'same page'`); got != true {
		t.Fatalf("the page reloaded (window state lost): %v", got)
	}

	if path := os.Getenv("CRDIPC_CONSOLE_SCREENSHOT"); path != "" {
		screenshot(t, up, page, path)
	}
}

// traceWaterfall sends a new Book with `crdipc call --trace` and opens its trace from the
// page: the completion's trace link is the trace call printed, and the waterfall it opens
// shows kube-apiserver's spans and the books receiver's, the reconcile under the call's span.
func traceWaterfall(t *testing.T, up *upProcess, page *browserPage, console string) {
	t.Helper()
	// A Book of its own: applying the sample again would be no new generation, so no
	// reconcile, no receiver span.
	book := filepath.Join(t.TempDir(), "book.yaml")
	if err := os.WriteFile(book, []byte("apiVersion: library.crdipc.io/v1alpha1\nkind: Book\nmetadata:\n  name: great-expectations\n  namespace: default\nspec:\n  title: Great Expectations\n  author: Charles Dickens\n  isbn: 978-0-14-143956-3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := callTraced(t, up, console, book)
	// The sender's span is the reconcile's parent; call wrote it on the Book.
	tp := up.Kubectl(t, "get", "book", "great-expectations", "-o", `jsonpath={.metadata.annotations.tracing\.k8s\.io/traceparent}`)
	m := regexp.MustCompile(`^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$`).FindStringSubmatch(tp)
	if m == nil || m[1] != id {
		t.Fatalf("the Book's traceparent %q does not carry the trace %s that call printed", tp, id)
	}
	callSpan := m[2]

	row := `[data-completion="Book/default/great-expectations"]`
	page.waitFor(t, "the traced Book's completion, linked to its trace", 30*time.Second,
		fmt.Sprintf(`document.querySelector('%s a.trace-link')?.dataset.trace === %q`, row, id))
	// A click in the page, as a user's; the table is redrawn on every update, so it is
	// found and clicked in one step.
	page.eval(t, fmt.Sprintf(`document.querySelector('%s a.trace-link').click(); true`, row))
	if got := page.eval(t, `location.hash`); got != "#trace="+id {
		t.Fatalf("the trace link led to %v, want #trace=%s", got, id)
	}
	// The sender's spans are there too: call --trace sends them to the console (its OTLP
	// receiver) before it prints.
	page.waitFor(t, "the request's waterfall: the sender's, kube-apiserver's and the receiver's spans, the reconcile under the call's span", 30*time.Second,
		fmt.Sprintf(`(() => {
		const wf = document.getElementById('waterfall');
		if (wf.dataset.trace !== %[1]q || wf.dataset.state !== 'ready' || document.getElementById('trace').hidden) return false;
		const rows = [...wf.querySelectorAll('.span-row')];
		const row = (service, name) => rows.find((r) => r.dataset.service === service && (name === undefined || r.dataset.name === name));
		return row('crdipc-call', 'call Book')?.dataset.spanId === %[2]q && row('kube-apiserver') !== undefined &&
			row('books', 'queue wait') !== undefined && row('books', 'handle Book') !== undefined &&
			row('books', 'write status') !== undefined && row('books', 'reconcile Book')?.dataset.parentSpanId === %[2]q &&
			Number(wf.dataset.spans) === rows.length;
	})()`, id, callSpan))
	t.Logf("waterfall rows: %v", page.eval(t, `[...document.querySelectorAll('#waterfall .span-row')].map((r) => r.dataset.service + ' · ' + r.dataset.name).join('; ')`))

	// A span of the trace that arrives after the waterfall was drawn, as another process's
	// batch does, sent to the console's OTLP receiver by the SDK's own exporter: the open
	// waterfall shows it without a click.
	late := lateSpan(t, console, id, callSpan)
	page.waitFor(t, "the open waterfall to show a span that arrived after it was drawn", 20*time.Second,
		fmt.Sprintf(`(() => {
		const r = document.querySelector('#waterfall .span-row[data-span-id=%q]');
		return r !== null && r.dataset.service === 'e2e-late' && r.dataset.parentSpanId === %q;
	})()`, late, callSpan))
}

// lateSpan exports one span of trace traceID, a child of span parent, to up's console as
// service e2e-late, and returns its span ID.
func lateSpan(t *testing.T, console, traceID, parent string) string {
	t.Helper()
	tid, err := trace.TraceIDFromHex(traceID)
	if err != nil {
		t.Fatal(err)
	}
	sid, err := trace.SpanIDFromHex(parent)
	if err != nil {
		t.Fatal(err)
	}
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(strings.TrimSuffix(console, "/")+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("e2e-late"))))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true}))
	_, span := tp.Tracer("e2e").Start(ctx, "late span")
	span.End()
	return span.SpanContext().SpanID().String()
}

// screenshot fills the page with the walkthrough's objects and saves it as a PNG.
func screenshot(t *testing.T, up *upProcess, page *browserPage, path string) {
	up.Kubectl(t, "apply", "-f", "../../config/samples/")
	up.Kubectl(t, "apply", "-f", "../../config/samples/csi/")
	up.waitPodSucceeded(t, "data-writer")
	page.waitFor(t, "the claim's volume, with the node its pod ran on", time.Minute,
		`[...document.querySelectorAll('[data-volume^="crdipc-system/pvc-"] [data-user="default/data-writer"]')].some((u) => /node-\d/.test(u.textContent))`)
	if _, err := (btcd.Image{}).Find(); err == nil {
		page.waitFor(t, "the Bitcoin network Ready with its peer link", 2*time.Minute,
			`document.querySelector('[data-network="default/regtest"]')?.textContent.includes('1 peer link') ?? false`)
	}
	png, err := chromedp.Run(page.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("console screenshot: %s (%d bytes)", path, len(png))
}

// findChromium returns Debian's chromium, skipping the test without it unless
// CRDIPC_REQUIRE_CHROMIUM=1.
func findChromium(t *testing.T) string {
	t.Helper()
	return require.Tool(t, "CRDIPC_REQUIRE_CHROMIUM", "chromium", "chromium-browser")
}

// browserPage is one tab of a headless Chromium that the test drives over CDP.
type browserPage struct {
	ctx context.Context
	log *syncbuf.Buffer
}

// openBrowser starts chromium headless with a fresh profile, nothing fetched in the
// background, and one tab of width × height; the test's cleanup stops it.
func openBrowser(t *testing.T, chromium string, width, height int) *browserPage {
	t.Helper()
	log := &syncbuf.Buffer{}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium),
		chromedp.Headless,
		chromedp.NoSandbox, // root in a container: the sandbox cannot start
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true), // containers have a small /dev/shm
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
		chromedp.CombinedOutput(log),
	)
	ctx, cancelTab := chromedp.NewContext(alloc)
	// Registered after the profile's TempDir, so it runs first: the browser is gone
	// before its profile is removed.
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	return &browserPage{ctx: ctx, log: log}
}

// eval evaluates a JavaScript expression in the page.
func (p *browserPage) eval(t *testing.T, expr string) any {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[any](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// waitFor waits until the JavaScript expression is true in the page, failing with what
// the page shows after timeout. The browser polls; nothing is reloaded.
func (p *browserPage) waitFor(t *testing.T, what string, timeout time.Duration, expr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, timeout+5*time.Second)
	defer cancel()
	start := time.Now()
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(timeout), chromedp.WithPollingInterval(100*time.Millisecond)))
	if err != nil {
		text, _ := chromedp.Run(p.ctx, chromedp.Evaluate[string](`document.body.innerText`))
		t.Fatalf("waiting %v for the console to show %s: %v\npage text:\n%s", time.Since(start).Round(time.Millisecond), what, err, text)
	}
	t.Logf("console shows %s after %v", what, time.Since(start).Round(time.Millisecond))
}
