package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/crdipc/crdipc/internal/books"
	"github.com/crdipc/crdipc/ipc"
)

// upServices are the crdipc services `up` runs in-process, on one manager:
// one process has nothing to elect a leader against.
type upServices struct {
	names []string
	stop  func()
}

func startServices(ctx context.Context, cfg *rest.Config, o upOptions) (*upServices, error) {
	logFile, err := os.OpenFile(filepath.Join(o.dataDir, "logs", "crdipc.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening service log: %w", err)
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logFile), zap.Level(zapcore.InfoLevel)))

	mgr, err := newManager(cfg, "up", serviceOptions{metricsAddr: o.metricsAddr, healthAddr: o.healthAddr})
	if err != nil {
		logFile.Close()
		return nil, err
	}
	svc := &upServices{}
	if err := books.Register(mgr, ipc.Options{}); err != nil {
		logFile.Close()
		return nil, err
	}
	svc.names = append(svc.names, "books")

	mgrCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		cancel()
		logFile.Close()
		return nil, fmt.Errorf("services: informer caches did not sync: %w", <-done)
	}
	svc.stop = func() {
		cancel()
		<-done
		logFile.Close()
	}
	return svc, nil
}
