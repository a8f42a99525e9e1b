package controlplane

import (
	"fmt"

	"k8s.io/client-go/rest"

	"github.com/crdipc/crdipc/internal/clientcert"
)

// NodeConfig is a client config that authenticates as node's kubelet, system:node:<node>
// in group system:nodes, so that the Node authorizer and NodeRestriction admission hold
// whatever it does to what a kubelet of that node may do (see ClientConfig).
func (cp *ControlPlane) NodeConfig(node string) (*rest.Config, error) {
	if node == "" {
		return nil, fmt.Errorf("node credentials: no node name")
	}
	cfg, err := cp.issueClientConfig(clientcert.NodeRequest(node))
	if err != nil {
		return nil, err
	}
	// The kubelet's user agent shape, so audit and logs name the node.
	cfg.UserAgent = "crdipc-simulated-kubelet/" + node
	return cfg, nil
}

// ClientConfig is a client config that authenticates as user in groups, with a certificate
// issued from the cluster's CA in memory, valid for a year, and never written: a restart
// issues a new one, so there is nothing on disk to reuse, expire or leak. What it may do is
// what RBAC (or the Node authorizer) grants that user. The identity rules are
// clientcert's, the same a real node's `crdipc kubeconfig` request meets.
func (cp *ControlPlane) ClientConfig(user string, groups ...string) (*rest.Config, error) {
	return cp.issueClientConfig(clientcert.Request{User: user, Groups: groups})
}

func (cp *ControlPlane) issueClientConfig(r clientcert.Request) (*rest.Config, error) {
	ca, caKey, err := loadPair(cp.pki.caCert, cp.pki.caKey)
	if err != nil {
		return nil, fmt.Errorf("client credentials for %s: %w", r.User, err)
	}
	issued, err := clientcert.Sign(ca, caKey, r)
	if err != nil {
		return nil, fmt.Errorf("client credentials for %s: %w", r.User, err)
	}
	return &rest.Config{
		Host: cp.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAFile:   cp.pki.caCert,
			CertData: issued.Cert,
			KeyData:  issued.Key,
		},
		// As every in-process client of up: the API server's priority and fairness protects it.
		QPS:   -1,
		Burst: 1000,
	}, nil
}
