package ipc

import (
	"context"
	"fmt"
	"maps"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CallOption changes how Call writes the request.
type CallOption func(*callOptions)

type callOptions struct {
	apply          bool
	fieldManager   string
	tracerProvider trace.TracerProvider
}

// WithServerSideApply makes Call write the request with server-side apply
// under fieldManager instead of creating it, so calling again with the same
// object is idempotent and calling with a changed spec updates the request
// (a new generation) and waits for the receiver's reply to that.
func WithServerSideApply(fieldManager string) CallOption {
	return func(o *callOptions) { o.apply, o.fieldManager = true, fieldManager }
}

// WithTracerProvider makes Call trace the request with tp instead of the
// global provider (otel.GetTracerProvider).
func WithTracerProvider(tp trace.TracerProvider) CallOption {
	return func(o *callOptions) { o.tracerProvider = tp }
}

// CallIDAnnotation marks a request with the Call that created it. When a
// create's response is lost (the connection broke, the API server restarted),
// Call cannot know whether the object was stored and creates it again; if the
// name is then taken by an object carrying its own call ID, that object is
// the request it sent, and Call waits for it instead of failing or sending a
// second one.
const CallIDAnnotation = "ipc.crdipc.io/call-id"

// maxGeneratedPrefix keeps a generated name within the 63 characters every
// kind accepts, as the API server's own generateName does.
const maxGeneratedPrefix = 63 - 5

// Call sends a request and waits for the reply: it creates obj (or applies
// it, see WithServerSideApply) and then Awaits cond. On return obj holds the
// last state seen, status included.
//
// Call survives an unreachable or restarting API server: it retries the
// write with backoff until ctx ends, and it sends each request at most once.
// A create is marked with CallIDAnnotation so that a retry recognises an
// earlier attempt that was stored although its response was lost; a name
// left to metadata.generateName is chosen by Call, before the first attempt,
// so that every attempt creates the same name. A name that is taken by
// another request is an error (AlreadyExists), as it is for a plain create,
// except with generateName, where Call picks another name.
//
// Call is one span, "call <Kind>", of the trace in ctx or of a new one, and
// stores its context on the request (TraceParentAnnotation) for the
// receiver to continue.
func Call(ctx context.Context, c client.WithWatch, obj client.Object, cond Condition, opts ...CallOption) (err error) {
	var o callOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.tracerProvider == nil {
		o.tracerProvider = otel.GetTracerProvider()
	}
	ctx, span := o.tracerProvider.Tracer(tracerName).Start(ctx, "call "+kindOf(obj), trace.WithSpanKind(trace.SpanKindClient))
	defer func() {
		if span.IsRecording() {
			span.SetAttributes(requestAttributes(obj)...)
		}
		EndSpan(span, err)
	}()
	InjectTraceContext(ctx, obj)
	if o.apply {
		// Apply is idempotent: repeating it after a lost response changes nothing.
		if err := retry(ctx, newBackoff(), func() error {
			return limited(ctx, func() error { return apply(ctx, c, obj, o.fieldManager) })
		}); err != nil {
			return err
		}
	} else if err := create(ctx, c, obj); err != nil {
		return err
	}
	return Await(ctx, c, obj, cond)
}

// create creates obj once, however many attempts that takes (see Call).
func create(ctx context.Context, c client.Client, obj client.Object) error {
	generated := obj.GetName() == "" && obj.GetGenerateName() != ""
	if generated {
		obj.SetName(generateName(obj.GetGenerateName()))
	}
	id := string(uuid.NewUUID())
	annotations := maps.Clone(obj.GetAnnotations())
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[CallIDAnnotation] = id
	obj.SetAnnotations(annotations)

	backoff := newBackoff()
	unsure := false // an earlier attempt may have stored obj
	for {
		err := limited(ctx, func() error { return c.Create(ctx, obj) })
		switch {
		case err == nil:
			return nil
		case apierrors.IsAlreadyExists(err):
			existing, ok := obj.DeepCopyObject().(client.Object)
			if !ok {
				return fmt.Errorf("creating request: %T is not a client.Object", obj)
			}
			gerr := retry(ctx, backoff, func() error {
				return limited(ctx, func() error { return c.Get(ctx, client.ObjectKeyFromObject(existing), existing) })
			})
			switch {
			case gerr == nil && existing.GetAnnotations()[CallIDAnnotation] == id:
				// An earlier attempt was stored; its response was lost.
				return assign(obj, existing)
			case gerr == nil && generated:
				// Another request drew the same name: draw again.
				obj.SetName(generateName(obj.GetGenerateName()))
				unsure = false
				continue
			case gerr == nil:
				return fmt.Errorf("creating request: %w", err)
			case apierrors.IsNotFound(gerr) && !unsure:
				// Someone else's request, deleted since: the name is free again.
				continue
			case apierrors.IsNotFound(gerr):
				return fmt.Errorf("creating request %s: an earlier attempt may have been stored and %w", key(obj.GetNamespace(), obj.GetName()), ErrDeleted)
			default:
				return fmt.Errorf("creating request: %w", gerr)
			}
		case ctx.Err() != nil:
			return fmt.Errorf("creating request: %w (last attempt: %w)", ctx.Err(), err)
		case !transient(err):
			return fmt.Errorf("creating request: %w", err)
		}
		unsure = true
		if serr := sleepCtx(ctx, backoff.Step()); serr != nil {
			return fmt.Errorf("creating request: %w (last attempt: %w)", serr, err)
		}
	}
}

// generateName does what the API server does with metadata.generateName,
// on the client, so that a retried create keeps the name of the first.
func generateName(prefix string) string {
	if len(prefix) > maxGeneratedPrefix {
		prefix = prefix[:maxGeneratedPrefix]
	}
	return prefix + utilrand.String(5)
}

func apply(ctx context.Context, c client.Client, obj client.Object, fieldManager string) error {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return fmt.Errorf("applying request: %w", err)
		}
		u = &unstructured.Unstructured{Object: m}
		gvk, err := c.GroupVersionKindFor(obj)
		if err != nil {
			return fmt.Errorf("applying request: %w", err)
		}
		u.SetGroupVersionKind(gvk)
	}
	// An apply body states intent only: no status, no server-owned metadata.
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "resourceVersion")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "metadata", "managedFields")
	if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(fieldManager), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying request: %w", err)
	}
	// Apply fills u with the server's answer; hand it back in obj's type.
	if obj != client.Object(u) {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
			return fmt.Errorf("applying request: %w", err)
		}
	}
	return nil
}
