package services

import (
	"github.com/spf13/pflag"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/crdipc/crdipc/internal/books"
	"github.com/crdipc/crdipc/ipc"
)

func booksEntry() Entry {
	return Entry{
		Name:  "books",
		Short: "Run the Book controller (seed 002)",
		Long: `books reconciles Books (library.crdipc.io): it checks the ISBN checksum
the schema cannot, and replies in each Book's status with Ready=True
(reason Succeeded) or Ready=False (reason InvalidSpec, terminal), plus an
Event. Finished Books with spec.ttlSecondsAfterFinished are deleted after it.

Run two replicas for availability: leader election lets only one act.`,
		Kind: Controllers,
		New:  func() Service { return &booksService{} },
	}
}

type booksService struct{}

func (*booksService) AddFlags(*pflag.FlagSet) {}

func (*booksService) Setup(mgr manager.Manager, env Env) error {
	return books.Register(mgr, ipc.Options{TracerProvider: env.TracerProvider("books")})
}
