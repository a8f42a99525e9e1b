package controlplane

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/configz"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
)

// schedulerConfigz is the name kube-scheduler registers its configuration under (configz
// is process-wide: a restarted scheduler must find it free).
const schedulerConfigz = "componentconfig"

// startScheduler runs kube-scheduler in this process with its default profile, as its
// command would from flags: no leader election (there is one) and no serving port (its
// health is the API server's concern here). It binds every pod of the default scheduler,
// on simulated and real nodes alike.
func startScheduler(ctx context.Context, kubeconfig string) (*component, error) {
	registerVersion()
	o := options.NewOptions()
	fs := pflag.NewFlagSet("kube-scheduler", pflag.ContinueOnError)
	for _, f := range o.Flags.FlagSets {
		fs.AddFlagSet(f)
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kube-scheduler flags: %w", err)
	}
	if err := o.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, fmt.Errorf("kube-scheduler feature gates: %w", err)
	}
	name, err := cache.NewInformerName("kube-scheduler")
	if err != nil {
		return nil, fmt.Errorf("kube-scheduler informer name: %w", err)
	}
	o.InformerName = name
	cc, sched, err := app.Setup(ctx, o)
	if err != nil {
		name.Release()
		return nil, fmt.Errorf("kube-scheduler: %w", err)
	}
	configz.Delete(schedulerConfigz)
	return runComponent("kube-scheduler", func() error {
		defer name.Release()
		err := app.Run(ctx, cc, sched)
		if ctx.Err() != nil {
			// Without leader election, Run reports its end as "finished without leader
			// elect" whatever the cause: a stop is not an error.
			return nil
		}
		return err
	}), nil
}
