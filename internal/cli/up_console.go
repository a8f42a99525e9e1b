package cli

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/crdipc/crdipc/internal/console"
	"github.com/crdipc/crdipc/internal/cpushare"
)

// defaultConsoleAddr is where up serves its console unless --console-addr says otherwise.
const defaultConsoleAddr = "127.0.0.1:8070"

// startConsole serves up's live console (internal/console) on o.consoleAddr and adds its
// address line. It reads with cfg, the console's own read-only ServiceAccount
// (config/rbac/console): a web page on a port anyone on the host may open must not hold
// up's admin credentials.
func startConsole(ctx context.Context, cfg *rest.Config, o upOptions, svc *upServices) error {
	ln, err := listenOrAny("console", o.consoleAddr, o.explicit["console-addr"])
	if err != nil {
		return err
	}
	co := console.Options{Config: cfg, Logger: ctrl.Log.WithName("console"), Traces: o.traceStore}
	if o.traceStore != nil {
		co.Spans = o.traceStore.OTLPHandler()
	}
	con, err := console.New(co)
	if err != nil {
		ln.Close()
		return err
	}
	srv := &http.Server{
		Handler:           con,
		ReadHeaderTimeout: 10 * time.Second,
		// Event streams end with ctx; Close below then has nothing to wait for.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	// Under its own label, as the services are: its snapshots' CPU shows as the console's.
	cpushare.Do("console", func() { svc.background(ctx, con.Start) })
	svc.background(ctx, func(ctx context.Context) error {
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(ln) }()
		select {
		case err := <-errc:
			return fmt.Errorf("console: %w", err)
		case <-ctx.Done():
			_ = srv.Close()
			<-errc
			return nil
		}
	})
	svc.lines = append(svc.lines, fmt.Sprintf("console  http://%s/", ln.Addr()))
	return nil
}
