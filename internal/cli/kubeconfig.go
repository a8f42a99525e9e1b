package cli

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// restConfig loads a client config the way kubectl does: the flag, then
// $KUBECONFIG, then ~/.kube/config, then in-cluster.
func restConfig(path string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	// Our services issue bursts of small writes; client-go's default
	// 5 QPS would throttle them long before the API server is busy.
	cfg.QPS, cfg.Burst = -1, 1000
	return cfg, nil
}
