package controlplane_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/cpushare"
	"github.com/crdipc/crdipc/internal/testenv"
)

// TestComponentsCarryTheirLabel checks that the control plane's CPU is counted as its
// components', not lost among the unlabelled: while a client creates Books, the work of
// serving them shows under kube-apiserver and under etcd.
func TestComponentsCarryTheirLabel(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// One create before sampling: the client discovers the API, and a create within 2 s of
	// its CRD becoming Established sleeps 2 s in the API server (apiextensions' guard for
	// clusters of several API servers), which is the case right after the control plane
	// starts.
	if err := env.Client.Create(ctx, book(ns, "cpu-first")); err != nil {
		t.Fatal(err)
	}
	created := make(chan int, 1)
	var createErr error
	go func() {
		n := 0
		for ctx.Err() == nil {
			if err := env.Client.Create(ctx, book(ns, fmt.Sprintf("cpu-%d", n))); err != nil {
				if ctx.Err() == nil {
					createErr = err
				}
				break
			}
			n++
		}
		created <- n
	}()
	s, err := cpushare.Measure(ctx, 2*time.Second)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	n := <-created
	t.Logf("%d Books created; cores by component %v", n, s.Cores)
	if createErr != nil || n == 0 {
		t.Fatalf("%d Books created while CPU was sampled: %v", n, createErr)
	}
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if s.Cores[name] <= 0 {
			t.Errorf("%s: no CPU sampled while it served %d creates: its goroutines lack the label %q", name, n, cpushare.Label)
		}
	}
}
