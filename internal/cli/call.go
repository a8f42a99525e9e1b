package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/crdipc/crdipc/internal/scheme"
	"github.com/crdipc/crdipc/internal/services"
	"github.com/crdipc/crdipc/internal/tracing"
	"github.com/crdipc/crdipc/ipc"
)

type callOptions struct {
	file      string
	forCond   string
	timeout   time.Duration
	cluster   services.ClusterFlags
	namespace string
	apply     bool
	trace     bool
	console   string
}

func newCallCommand() *cobra.Command {
	o := callOptions{forCond: "condition=Ready", timeout: 30 * time.Second}
	cmd := &cobra.Command{
		Use:   "call -f FILE",
		Short: "Send a request (create a custom resource) and wait for the receiver's reply",
		Long: `call creates the object in FILE (YAML or JSON, one object; '-' reads stdin)
and waits, with a watch, until its status is current (observedGeneration >=
generation) and the condition holds. Then it prints the object's status and
Events.

It works on any kind that follows crdipc's status contract.

With --trace, the request is traced (OpenTelemetry): its W3C trace context goes
on the object (annotation tracing.k8s.io/traceparent), which the receiver
continues, and on each API request, which kube-apiserver continues. When the
reply comes back, call prints "trace <id>" and the span tree: its own spans,
and kube-apiserver's and the receivers' from crdipc up's console (--console).
The spans are also exported to $OTEL_EXPORTER_OTLP_ENDPOINT when it is set.

Exit codes: 0 the condition holds; 1 the receiver reported a terminal failure
(its message is printed) or another error; 2 the timeout passed first.`,
		Example: `  crdipc call -f config/samples/library_v1alpha1_book.yaml
  crdipc call -f volume.yaml --timeout 2m
  crdipc call -f book.yaml --apply      # idempotent: server-side apply, then wait
  crdipc call -f book.yaml --trace      # and print the request's trace: sender, kube-apiserver, receiver`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCall(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().StringVarP(&o.file, "filename", "f", "", "file with the request object ('-' for stdin)")
	cmd.Flags().StringVar(&o.forCond, "for", o.forCond, "what to wait for: condition=<Type>, e.g. condition=Ready")
	cmd.Flags().DurationVar(&o.timeout, "timeout", o.timeout, "give up after this long (exit code 2)")
	o.cluster.AddFlags(cmd.Flags())
	cmd.Flags().StringVarP(&o.namespace, "namespace", "n", "", "namespace for a namespaced object that names none (default: the kubeconfig's)")
	cmd.Flags().BoolVar(&o.apply, "apply", false, "server-side apply instead of create, so repeating the call is idempotent")
	cmd.Flags().BoolVar(&o.trace, "trace", false, "trace the request and print its trace ID and span tree when the reply comes back")
	cmd.Flags().StringVar(&o.console, "console", "http://"+defaultConsoleAddr, "with --trace: crdipc up's console, which holds the spans of kube-apiserver and the receivers and receives this process's ('' to print this process's spans only)")
	_ = cmd.MarkFlagRequired("filename")
	return cmd
}

func parseFor(s string) (ipc.Condition, string, error) {
	t, ok := strings.CutPrefix(s, "condition=")
	if !ok || t == "" || strings.Contains(t, "=") {
		return nil, "", fmt.Errorf("--for %q: want condition=<Type>, e.g. condition=Ready", s)
	}
	return ipc.ConditionTrue(t), t, nil
}

func readObject(path string) (*unstructured.Unstructured, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("reading request: %w", err)
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &u.Object); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", path, err)
	}
	if u.Object == nil || u.GetKind() == "" || u.GetAPIVersion() == "" {
		return nil, fmt.Errorf("%s: not a Kubernetes object (apiVersion and kind are required)", path)
	}
	if u.GetName() == "" && u.GetGenerateName() == "" {
		return nil, fmt.Errorf("%s: metadata.name (or generateName) is required", path)
	}
	return u, nil
}

func runCall(ctx context.Context, out io.Writer, o callOptions) error {
	cond, condType, err := parseFor(o.forCond)
	if err != nil {
		return err
	}
	obj, err := readObject(o.file)
	if err != nil {
		return err
	}
	cfg, err := o.cluster.Config()
	if err != nil {
		return err
	}
	var opts []ipc.CallOption
	var store *tracing.Store
	flush := func(context.Context) error { return nil }
	if o.trace {
		store = tracing.NewStore(1, 0)
		to := tracing.Options{Store: store}
		if o.console != "" {
			// up's console receives this process's spans too: its waterfall of the request
			// then starts at the sender.
			to.Receivers = []string{o.console}
		}
		p, err := tracing.New(ctx, to)
		if err != nil {
			return err
		}
		flush = p.ForceFlush
		defer func() { _ = p.ShutdownWithin(5 * time.Second) }()
		cfg = p.RESTConfig(cfg, "crdipc-call")
		opts = append(opts, ipc.WithTracerProvider(p.Service("crdipc-call")))
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme.Scheme})
	if err != nil {
		return fmt.Errorf("creating client: %w", err)
	}
	namespaced, err := c.IsObjectNamespaced(obj)
	if err != nil {
		return fmt.Errorf("%s: %w", obj.GroupVersionKind(), err)
	}
	if namespaced && obj.GetNamespace() == "" {
		ns := o.namespace
		if ns == "" {
			rules := clientcmd.NewDefaultClientConfigLoadingRules()
			rules.ExplicitPath = o.cluster.Kubeconfig
			ns, _, _ = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).Namespace()
		}
		obj.SetNamespace(ns)
	}

	cctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if o.apply {
		opts = append(opts, ipc.WithServerSideApply("crdipc-call"))
	}
	start := time.Now()
	callErr := ipc.Call(cctx, c, obj, cond, opts...)
	ref := strings.ToLower(obj.GetKind()) + "." + obj.GroupVersionKind().Group + "/" + obj.GetName()

	var terminal *ipc.TerminalError
	switch {
	case callErr == nil:
		fmt.Fprintf(out, "%s: %s=True after %.3f s\n", ref, condType, time.Since(start).Seconds())
	case errors.As(callErr, &terminal):
		fmt.Fprintf(out, "%s: failed: %s: %s\n", ref, terminal.Reason, terminal.Message)
	case errors.Is(callErr, context.DeadlineExceeded):
		fmt.Fprintf(out, "%s: timed out after %s waiting for %s\n", ref, o.timeout, o.forCond)
	default:
		if obj.GetUID() == "" {
			return callErr // nothing was created
		}
	}
	if obj.GetUID() != "" {
		printStatus(out, obj)
		printEvents(out, c, obj)
	}
	if o.trace {
		fctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_ = flush(fctx) // a console that is not there is said by printTrace
		cancel()
		printTrace(ctx, out, store, obj.GetAnnotations(), o.console)
	}
	switch {
	case callErr == nil:
		return nil
	case terminal != nil:
		return &exitError{code: 1, err: callErr}
	case errors.Is(callErr, context.DeadlineExceeded):
		return &exitError{code: 2, err: fmt.Errorf("timed out waiting for %s", o.forCond)}
	default:
		return callErr
	}
}

func printStatus(out io.Writer, obj *unstructured.Unstructured) {
	status, _, _ := unstructured.NestedMap(obj.Object, "status")
	data, err := yaml.Marshal(map[string]any{"status": status})
	if err != nil {
		return
	}
	fmt.Fprintf(out, "\n%s", data)
}

// printEvents lists the object's Events. Receivers record them
// asynchronously, just after the status write that ended the wait, so it
// waits briefly for at least one to arrive.
func printEvents(out io.Writer, c client.Client, obj *unstructured.Unstructured) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var list corev1.EventList
	sel := fields.OneTermEqualSelector("involvedObject.uid", string(obj.GetUID()))
	_ = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		err := c.List(ctx, &list, client.InNamespace(obj.GetNamespace()), client.MatchingFieldsSelector{Selector: sel})
		return err == nil && len(list.Items) > 0, nil
	})
	fmt.Fprintln(out, "\nEvents:")
	if len(list.Items) == 0 {
		fmt.Fprintln(out, "  <none>")
		return
	}
	for _, e := range list.Items {
		at := e.LastTimestamp.Time
		if at.IsZero() {
			at = e.EventTime.Time
		}
		fmt.Fprintf(out, "  %s  %-7s  %-12s  %s\n", at.Format(time.TimeOnly), e.Type, e.Reason, e.Message)
	}
}

// printTrace prints the request's trace ID and its span tree.
func printTrace(ctx context.Context, out io.Writer, store *tracing.Store, annotations map[string]string, consoleURL string) {
	id := ipc.ExtractTraceContext(ctx, &metav1.ObjectMeta{Annotations: annotations})
	sc := trace.SpanContextFromContext(id)
	if !sc.IsValid() {
		fmt.Fprintln(out, "\ntrace: the request carries no trace context")
		return
	}
	spans, err := traceSpans(ctx, store, sc.TraceID(), consoleURL, 5*time.Second)
	fmt.Fprintf(out, "\ntrace %s\n", sc.TraceID())
	printTraceTree(out, spans)
	if err != nil {
		fmt.Fprintf(out, "  (only this process's spans: %v)\n", err)
	}
}
