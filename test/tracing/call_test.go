package tracing

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/otel/trace"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/collector"
	"github.com/crdipc/crdipc/internal/tracing"
	"github.com/crdipc/crdipc/ipc"
)

var (
	otlp     *collector.Collector
	provider *tracing.Provider
)

type span = collector.Span

// TestMain starts the collector, then the control plane with kube-apiserver
// exporting to it, configured as a user would: by the standard variables.
func TestMain(m *testing.M) {
	ctx := context.Background()
	var err error
	if otlp, err = collector.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "collector:", err)
		os.Exit(1)
	}
	for k, v := range map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + otlp.GRPC,
		"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
		"OTEL_TRACES_EXPORTER":        "",
		"OTEL_TRACES_SAMPLER":         "",
		"OTEL_SDK_DISABLED":           "",
	} {
		os.Setenv(k, v)
	}
	if provider, err = tracing.New(ctx, tracing.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, "tracing:", err)
		os.Exit(1)
	}
	testenv.Main(m, testenv.WithTracerProvider(provider.APIServer()))
}

const (
	senderService   = "sender"
	receiverService = "books"
)

type book = libraryv1alpha1.Book

// startReceiver runs a Book receiver that traces with the named service's
// provider, its client carrying the trace to the API server.
func startReceiver(t *testing.T, service string) {
	t.Helper()
	env := testenv.Get(t)
	mgr, err := ctrl.NewManager(provider.RESTConfig(env.Config, service), ctrl.Options{
		Scheme:                 scheme.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := ipc.HandlerFunc[*book](func(_ context.Context, b *book) (ipc.Result, error) {
		return ipc.Done("catalogued " + b.Spec.Title), nil
	})
	if err := ipc.Register(mgr, &book{}, h, ipc.Options{TracerProvider: provider.Service(service), LeaseDuration: -1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func TestCallIsOneTraceThroughAPIServerAndReceiver(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	startReceiver(t, receiverService)
	sender, err := client.NewWithWatch(provider.RESTConfig(env.Config, senderService), client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}

	b := &book{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dune"},
		Spec:       libraryv1alpha1.BookSpec{Title: "Dune", Author: "Frank Herbert"},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ipc.Call(ctx, sender, b, ipc.Ready, ipc.WithTracerProvider(provider.Service(senderService))); err != nil {
		t.Fatalf("call: %v", err)
	}

	// The request carries the call's span; the receiver left it as it was.
	stored := &book{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(b), stored); err != nil {
		t.Fatal(err)
	}
	traceparent := stored.Annotations[ipc.TraceParentAnnotation]
	if traceparent == "" || traceparent != b.Annotations[ipc.TraceParentAnnotation] {
		t.Fatalf("stored traceparent %q, want the one Call wrote, %q", traceparent, b.Annotations[ipc.TraceParentAnnotation])
	}
	sc := traceparentOf(t, stored)
	id := sc.TraceID()

	var call span
	tr := waitTrace(t, id, "the collector to receive the request's trace", func(tr traceSpans) error {
		spans, under := tr.all, tr.under
		var ok bool
		if call, ok = find(spans, senderService, "call Book"); !ok {
			return errors.New("no call span from the sender")
		}
		if call.SpanID != sc.SpanID() {
			return fmt.Errorf("the annotation names span %s, the call span is %s", sc.SpanID(), call.SpanID)
		}
		if call.Parent.IsValid() || call.Kind != ptrace.SpanKindClient {
			return fmt.Errorf("call span %s: want a root client span", call)
		}
		create, ok := findFunc(spans, func(s span) bool {
			return s.Service == tracing.APIServerService && strings.HasPrefix(s.Name, "POST /apis/library.crdipc.io/v1alpha1/namespaces/{:namespace}/books")
		})
		if !ok {
			return errors.New("no kube-apiserver span for the create")
		}
		if !under(create, call.SpanID) {
			return fmt.Errorf("kube-apiserver's create span %s does not descend from the call span", create)
		}
		// A request may be reconciled more than once (the cache behind a write); each
		// reconcile continues the same trace.
		reconciles := map[trace.SpanID]bool{}
		for _, r := range filter(spans, func(s span) bool { return s.Service == receiverService && s.Name == "reconcile Book" }) {
			if r.Parent != call.SpanID {
				return fmt.Errorf("reconcile span %s: want the call span %s, from the annotation, as its parent", r, call.SpanID)
			}
			reconciles[r.SpanID] = true
		}
		if len(reconciles) == 0 {
			return errors.New("no reconcile span from the receiver")
		}
		var writes []span
		for _, name := range []string{"queue wait", "handle Book", "write status"} {
			found := filter(spans, func(s span) bool { return s.Service == receiverService && s.Name == name })
			if len(found) == 0 {
				return fmt.Errorf("no %q span from the receiver", name)
			}
			for _, s := range found {
				if !reconciles[s.Parent] {
					return fmt.Errorf("%s: want a reconcile span as its parent", s)
				}
			}
			writes = found
		}
		status, ok := findFunc(spans, func(s span) bool {
			return s.Service == tracing.APIServerService && strings.HasSuffix(s.Name, "/books/{:name}/status")
		})
		if !ok {
			return errors.New("no kube-apiserver span for the status write")
		}
		if !slices.ContainsFunc(writes, func(w span) bool { return under(status, w.SpanID) }) {
			return fmt.Errorf("kube-apiserver's status span %s does not descend from the receiver's status write", status)
		}
		return nil
	})

	// One trace: every span about this request, from every service, is in it.
	about := otlp.Spans(func(s span) bool {
		return s.Attributes["ipc.name"] == b.Name && s.Attributes["k8s.namespace.name"] == ns
	})
	for _, s := range about {
		if s.TraceID != id {
			t.Errorf("span %s of the request is in trace %s, not %s", s, s.TraceID, id)
		}
	}
	tr.log(t)
}

func find(spans []span, service, name string) (span, bool) {
	return findFunc(spans, func(s span) bool { return s.Service == service && s.Name == name })
}

func findFunc(spans []span, keep func(span) bool) (span, bool) {
	if found := filter(spans, keep); len(found) > 0 {
		return found[0], true
	}
	return span{}, false
}

func filter(spans []span, keep func(span) bool) []span {
	var out []span
	for _, s := range spans {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}

// kube-apiserver shuts its tracer provider down when it stops; the one crdipc gives it
// outlives it, so that a restarted control plane (a restarted `crdipc up`) still traces.
func TestAPIServerTracesAfterRestart(t *testing.T) {
	env := testenv.Get(t)
	env.Restart(t)
	ns := env.Namespace(t)
	c, err := client.New(provider.RESTConfig(env.Config, senderService), client.Options{Scheme: scheme.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, sent := provider.Service(senderService).Tracer("test").Start(context.Background(), "create after restart")
	b := &book{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "emma"},
		Spec:       libraryv1alpha1.BookSpec{Title: "Emma", Author: "Jane Austen"},
	}
	err = c.Create(ctx, b)
	sent.End()
	if err != nil {
		t.Fatal(err)
	}
	id := sent.SpanContext().TraceID()
	testenv.Eventually(t, 20*time.Second, "kube-apiserver's span of the create to reach the collector", func(ctx context.Context) (bool, error) {
		if err := provider.ForceFlush(ctx); err != nil {
			return false, err
		}
		spans := otlp.Spans(func(s span) bool {
			return s.TraceID == id && s.Service == tracing.APIServerService && s.Kind == ptrace.SpanKindServer
		})
		return len(spans) > 0, nil
	})
}
