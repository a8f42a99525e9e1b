package ipc

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// CallOption changes how Call writes the request.
type CallOption func(*callOptions)

type callOptions struct {
	apply        bool
	fieldManager string
}

// WithServerSideApply makes Call write the request with server-side apply
// under fieldManager instead of creating it, so calling again with the same
// object is idempotent and calling with a changed spec updates the request
// (a new generation) and waits for the receiver's reply to that.
func WithServerSideApply(fieldManager string) CallOption {
	return func(o *callOptions) { o.apply, o.fieldManager = true, fieldManager }
}

// Call sends a request and waits for the reply: it creates obj (or applies
// it, see WithServerSideApply) and then Awaits cond. On return obj holds the
// last state seen, status included.
func Call(ctx context.Context, c client.WithWatch, obj client.Object, cond Condition, opts ...CallOption) error {
	var o callOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.apply {
		if err := apply(ctx, c, obj, o.fieldManager); err != nil {
			return err
		}
	} else if err := c.Create(ctx, obj); err != nil {
		return fmt.Errorf("creating request: %w", err)
	}
	return Await(ctx, c, obj, cond)
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
