package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"time"

	"k8s.io/client-go/rest"
)

// NodeConfig is a client config that authenticates as node's kubelet, system:node:<node>
// in group system:nodes, so that the Node authorizer and NodeRestriction admission hold
// whatever it does to what a kubelet of that node may do. Its certificate is issued from
// the cluster's CA in memory, valid for a year, and never written: a restart issues a new
// one, so there is nothing on disk to reuse, expire or leak.
func (cp *ControlPlane) NodeConfig(node string) (*rest.Config, error) {
	if node == "" {
		return nil, fmt.Errorf("node credentials: no node name")
	}
	ca, caKey, err := loadPair(cp.pki.caCert, cp.pki.caKey)
	if err != nil {
		return nil, fmt.Errorf("node credentials for %s: %w", node, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("node credentials for %s: generating key: %w", node, err)
	}
	tmpl := x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("node credentials for %s: signing: %w", node, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("node credentials for %s: encoding key: %w", node, err)
	}
	return &rest.Config{
		Host: cp.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAFile:   cp.pki.caCert,
			CertData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			KeyData:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		},
		// As every in-process client of up: the API server's priority and fairness protects it.
		QPS:   -1,
		Burst: 1000,
		// The kubelet's user agent shape, so audit and logs name the node.
		UserAgent: "crdipc-simulated-kubelet/" + node,
	}, nil
}
