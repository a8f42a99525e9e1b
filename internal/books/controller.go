package books

import (
	"context"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/manager"

	libraryv1alpha1 "github.com/crdipc/crdipc/api/library/v1alpha1"
	"github.com/crdipc/crdipc/ipc"
)

// The Book controller's permissions: its kind, the Events it records, and
// the Leases for leader election and the receiver heartbeat.
// +kubebuilder:rbac:groups=library.crdipc.io,resources=books,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=library.crdipc.io,resources=books/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=library.crdipc.io,resources=books/finalizers,verbs=update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete,namespace=crdipc-system

// Register adds the Book receiver to mgr.
func Register(mgr manager.Manager, o ipc.Options) error {
	return ipc.Register(mgr, &libraryv1alpha1.Book{}, ipc.HandlerFunc[*libraryv1alpha1.Book](handle), o)
}

// handle catalogues a Book. It writes nothing outside the Book, so calling
// it again for the same generation is harmless.
func handle(_ context.Context, b *libraryv1alpha1.Book) (ipc.Result, error) {
	if b.Spec.ISBN != "" {
		if err := validISBN(b.Spec.ISBN); err != nil {
			return ipc.Result{}, ipc.InvalidSpec("spec.isbn %q: %v", b.Spec.ISBN, err)
		}
	}
	return ipc.Done(fmt.Sprintf("catalogued %q by %s", b.Spec.Title, b.Spec.Author)), nil
}

// validISBN checks an ISBN-10 or ISBN-13 checksum; the CRD schema has
// already checked the shape (digits, optional hyphens, X last in ISBN-10).
func validISBN(s string) error {
	d := strings.ReplaceAll(s, "-", "")
	switch len(d) {
	case 10:
		sum := 0
		for i, c := range d {
			v := int(c - '0')
			if i == 9 && (c == 'X' || c == 'x') {
				v = 10
			} else if c < '0' || c > '9' {
				return fmt.Errorf("character %q is not a digit", c)
			}
			sum += (10 - i) * v
		}
		if sum%11 != 0 {
			return fmt.Errorf("ISBN-10 checksum does not match")
		}
	case 13:
		sum := 0
		for i, c := range d {
			if c < '0' || c > '9' {
				return fmt.Errorf("character %q is not a digit", c)
			}
			w := 1
			if i%2 == 1 {
				w = 3
			}
			sum += w * int(c-'0')
		}
		if sum%10 != 0 {
			return fmt.Errorf("ISBN-13 checksum does not match")
		}
	default:
		return fmt.Errorf("has %d digits, want 10 or 13", len(d))
	}
	return nil
}
