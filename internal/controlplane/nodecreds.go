package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"slices"
	"time"

	"k8s.io/client-go/rest"
)

// NodeConfig is a client config that authenticates as node's kubelet, system:node:<node>
// in group system:nodes, so that the Node authorizer and NodeRestriction admission hold
// whatever it does to what a kubelet of that node may do (see ClientConfig).
func (cp *ControlPlane) NodeConfig(node string) (*rest.Config, error) {
	if node == "" {
		return nil, fmt.Errorf("node credentials: no node name")
	}
	cfg, err := cp.ClientConfig("system:node:"+node, "system:nodes")
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
// what RBAC (or the Node authorizer) grants that user.
func (cp *ControlPlane) ClientConfig(user string, groups ...string) (*rest.Config, error) {
	return issueClientConfig(cp.pki, cp.URL, user, groups...)
}

func issueClientConfig(p pki, url, user string, groups ...string) (*rest.Config, error) {
	if user == "" {
		return nil, fmt.Errorf("client credentials: no user name")
	}
	if slices.Contains(groups, "system:masters") {
		return nil, fmt.Errorf("client credentials for %s: group system:masters is the admin's alone", user)
	}
	ca, caKey, err := loadPair(p.caCert, p.caKey)
	if err != nil {
		return nil, fmt.Errorf("client credentials for %s: %w", user, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("client credentials for %s: generating key: %w", user, err)
	}
	tmpl := x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: user, Organization: groups},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("client credentials for %s: signing: %w", user, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("client credentials for %s: encoding key: %w", user, err)
	}
	return &rest.Config{
		Host: url,
		TLSClientConfig: rest.TLSClientConfig{
			CAFile:   p.caCert,
			CertData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			KeyData:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		},
		// As every in-process client of up: the API server's priority and fairness protects it.
		QPS:   -1,
		Burst: 1000,
	}, nil
}
