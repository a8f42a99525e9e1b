package testenv

import (
	"context"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/crdipc/crdipc/internal/scheme"
)

// NewManager returns a controller-runtime manager for a test: crdipc's scheme, no metrics or
// health listeners, and controller names that may repeat (a test binary starts many managers
// with the same controllers). opts adjust the options, e.g. to turn on leader election.
func NewManager(t testing.TB, cfg *rest.Config, opts ...func(*ctrl.Options)) manager.Manager {
	t.Helper()
	o := ctrl.Options{
		Scheme:                 scheme.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	}
	for _, f := range opts {
		f(&o)
	}
	mgr, err := ctrl.NewManager(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	return mgr
}

// Start runs run (e.g. a manager's Start) until the returned stop is called or the test
// ends. stop cancels it and waits for it to return; an error it returns fails the test.
func Start(t testing.TB, name string, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := run(ctx); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}
