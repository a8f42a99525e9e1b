package replica

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// closingSource is a memSource that counts its Close calls (a backup's reader, which holds a
// restore's marker in its store until closed).
type closingSource struct {
	memSource
	closed atomic.Int32
}

func (c *closingSource) Close() error { c.closed.Add(1); return nil }

// A fill closes a source that is an io.Closer once it stops reading it, and a second fill
// from the same source while the first runs closes the unused one at once.
func TestFillClosesItsSource(t *testing.T) {
	const size = 4 << 20
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.create("ns/r", size)
	n.start()
	src := &closingSource{memSource: memSource{b: make([]byte, size), exts: []Extent{{0, size}}}}
	pattern(src.b, 0)
	if err := n.srv.Fill("ns/r", "mem", src); err != nil {
		t.Fatal(err)
	}
	again := &closingSource{memSource: src.memSource}
	if err := n.srv.Fill("ns/r", "mem", again); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	r := n.dial(t).Replica("ns/r")
	wait.Eventually(t, 30*time.Second, "the fill done and its source closed", func(context.Context) (bool, error) {
		in, err := r.Info(ctx)
		if err != nil {
			return false, err
		}
		return !in.Rebuilding && src.closed.Load() == 1, stillRebuilding(in)
	})
	// The second, if the first still ran when it came, was closed unused; else it filled and
	// was closed too.
	wait.Eventually(t, 30*time.Second, "the second source closed", func(context.Context) (bool, error) {
		return again.closed.Load() == 1, nil
	})
}
