package replica

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// memSource is a Source in memory whose data are the ranges exts of b; failAt, when
// positive, fails the read that reaches it.
type memSource struct {
	b      []byte
	exts   []Extent
	failAt int64
}

func (m *memSource) Info(context.Context) (Info, error) {
	return Info{ID: "mem", Size: int64(len(m.b)), Revision: 1}, nil
}

func (m *memSource) Extents(_ context.Context, off, length int64) ([]Extent, error) {
	var out []Extent
	for _, e := range m.exts {
		lo, hi := max(e.Offset, off), min(e.Offset+e.Length, off+length)
		if lo < hi {
			out = append(out, Extent{lo, hi - lo})
		}
	}
	return out, nil
}

func (m *memSource) ReadAt(_ context.Context, p []byte, off int64) error {
	if m.failAt > 0 && off+int64(len(p)) > m.failAt {
		return errors.New("the store went away")
	}
	copy(p, m.b[off:])
	return nil
}

// Fill makes a replica a copy of a source in the process, which may be smaller than the
// replica, as a rebuild: the replica reads Rebuilding until it is done, then holds the
// source's bytes and revision. A source that fails leaves it Rebuilding with the error, and
// a fill again completes.
func TestFillFromALocalSource(t *testing.T) {
	const size, srcSize = 8 << 20, 6 << 20
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.create("ns/r", size)
	n.start()
	src := &memSource{b: make([]byte, srcSize), exts: []Extent{{0, 1 << 20}, {3 << 20, 3 << 20}}}
	for _, e := range src.exts {
		pattern(src.b[e.Offset:e.Offset+e.Length], uint64(e.Offset))
	}
	ctx := ctxT(t)
	r := n.dial(t).Replica("ns/r")
	done := func(in Info) (bool, error) { return !in.Rebuilding, stillRebuilding(in) }

	src.failAt = 4 << 20
	if err := n.srv.Fill("ns/r", "mem", src); err != nil {
		t.Fatal(err)
	}
	var in Info
	wait.Eventually(t, 30*time.Second, "the failed fill reported", func(context.Context) (bool, error) {
		var err error
		if in, err = r.Info(ctx); err != nil {
			return false, err
		}
		if in.RebuildError == "" {
			return false, stillRebuilding(in)
		}
		return true, nil
	})
	if !in.Rebuilding || in.RebuildSource != "local/mem" {
		t.Fatalf("after a failed fill: %+v", in)
	}

	src.failAt = 0
	if err := n.srv.Fill("ns/r", "mem", src); err != nil {
		t.Fatal(err)
	}
	wait.Eventually(t, 30*time.Second, "the fill done", func(context.Context) (bool, error) {
		var err error
		if in, err = r.Info(ctx); err != nil {
			return false, err
		}
		if in.RebuildError != "" {
			return false, errors.New(in.RebuildError)
		}
		return done(in)
	})
	if in.Revision != 1 || in.Dirty {
		t.Errorf("after the fill: %+v, want revision 1, clean", in)
	}
	got, err := os.ReadFile(n.path("ns/r"))
	if err != nil {
		t.Fatal(err)
	}
	want := append(bytes.Clone(src.b), make([]byte, size-srcSize)...)
	if !bytes.Equal(got, want) {
		t.Fatal("the filled replica differs from the source")
	}
}
