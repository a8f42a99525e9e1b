package controlplane

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/crdipc/crdipc/internal/safefile"
)

// pki holds the paths of the files the control plane's TLS and service
// account token signing use. Files are created once and reused, so a
// kubeconfig written by an earlier run stays valid across restarts.
type pki struct {
	dir                           string
	caCert, caKey                 string
	servingCert, servingKey       string
	adminCert, adminKey           string
	serviceAccountKey             string
	controllerCert, controllerKey string
	schedulerCert, schedulerKey   string
	// kubeletClient is the API server's identity towards kubelets (logs, exec, port-forward,
	// metrics): a kubelet that keeps anonymous access off and authorizes by webhook asks the
	// API server whether this user may, and the bootstrap binds it system:kubelet-api-admin.
	kubeletClientCert, kubeletClientKey string
	// etcd has a CA of its own, so no certificate of the cluster's CA (an admin's, a
	// controller's) opens etcd: only the API server's etcd client certificate does.
	etcdCACert, etcdCAKey         string
	etcdServerCert, etcdServerKey string
	etcdClientCert, etcdClientKey string
}

func newPKI(dir string) pki {
	p := func(name string) string { return filepath.Join(dir, name) }
	return pki{
		dir:               dir,
		caCert:            p("ca.crt"),
		caKey:             p("ca.key"),
		servingCert:       p("apiserver.crt"),
		servingKey:        p("apiserver.key"),
		adminCert:         p("admin.crt"),
		adminKey:          p("admin.key"),
		serviceAccountKey: p("service-account.key"),
		controllerCert:    p("controller-manager.crt"),
		controllerKey:     p("controller-manager.key"),
		schedulerCert:     p("scheduler.crt"),
		schedulerKey:      p("scheduler.key"),
		kubeletClientCert: p("apiserver-kubelet-client.crt"),
		kubeletClientKey:  p("apiserver-kubelet-client.key"),
		etcdCACert:        p("etcd-ca.crt"),
		etcdCAKey:         p("etcd-ca.key"),
		etcdServerCert:    p("etcd-server.crt"),
		etcdServerKey:     p("etcd-server.key"),
		etcdClientCert:    p("apiserver-etcd-client.crt"),
		etcdClientKey:     p("apiserver-etcd-client.key"),
	}
}

// kubeletClientUser is the user name of the API server's client certificate for kubelets.
const kubeletClientUser = "kube-apiserver-kubelet-client"

// ensure creates whatever is missing. It never replaces an existing CA: the
// clients' kubeconfigs and the stored service account tokens depend on it.
// servingIPs are addresses, besides loopback and the service IP, the API server's serving
// certificate must name (an advertise address): a certificate of an earlier run that lacks
// one is issued again, from the same CA.
func (p pki) ensure(servingIPs ...net.IP) error {
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return fmt.Errorf("creating pki dir: %w", err)
	}
	caCert, caKey, err := ensureCA(p.caCert, p.caKey, "crdipc-ca")
	if err != nil {
		return err
	}
	etcdCACert, etcdCAKey, err := ensureCA(p.etcdCACert, p.etcdCAKey, "crdipc-etcd-ca")
	if err != nil {
		return err
	}
	ips := append([]net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback, net.ParseIP(serviceIP)}, servingIPs...)
	if exists(p.servingCert) && !certNamesIPs(p.servingCert, ips) {
		if err := os.Remove(p.servingCert); err != nil {
			return fmt.Errorf("replacing the serving certificate: %w", err)
		}
	}
	leafs := []struct {
		cert, key string
		tmpl      x509.Certificate
	}{
		{p.servingCert, p.servingKey, x509.Certificate{
			Subject:     pkix.Name{CommonName: "kube-apiserver"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
			IPAddresses: ips,
		}},
		{p.adminCert, p.adminKey, x509.Certificate{
			Subject:     pkix.Name{CommonName: "crdipc-admin", Organization: []string{"system:masters"}},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}},
		{p.controllerCert, p.controllerKey, x509.Certificate{
			Subject:     pkix.Name{CommonName: "system:kube-controller-manager"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}},
		{p.schedulerCert, p.schedulerKey, x509.Certificate{
			Subject:     pkix.Name{CommonName: "system:kube-scheduler"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}},
		{p.kubeletClientCert, p.kubeletClientKey, x509.Certificate{
			Subject:     pkix.Name{CommonName: kubeletClientUser},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}},
	}
	for _, l := range leafs {
		if exists(l.cert) && exists(l.key) {
			continue
		}
		if err := writeLeaf(l.cert, l.key, l.tmpl, caCert, caKey); err != nil {
			return err
		}
	}
	etcdLeafs := []struct {
		cert, key string
		tmpl      x509.Certificate
	}{
		// Server and peer: the lone member's peer listener asks for a client certificate too.
		{p.etcdServerCert, p.etcdServerKey, x509.Certificate{
			Subject:     pkix.Name{CommonName: "etcd"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			DNSNames:    []string{"localhost"},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		}},
		{p.etcdClientCert, p.etcdClientKey, x509.Certificate{
			Subject:     pkix.Name{CommonName: "kube-apiserver-etcd-client"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}},
	}
	for _, l := range etcdLeafs {
		if exists(l.cert) && exists(l.key) {
			continue
		}
		if err := writeLeaf(l.cert, l.key, l.tmpl, etcdCACert, etcdCAKey); err != nil {
			return err
		}
	}
	if !exists(p.serviceAccountKey) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("generating service account key: %w", err)
		}
		if err := writeKey(p.serviceAccountKey, key); err != nil {
			return err
		}
	}
	return nil
}

// certNamesIPs reports whether the certificate at path names every one of ips; an
// unreadable certificate names none.
func certNamesIPs(path string, ips []net.IP) bool {
	b, err := safefile.ReadFile(path)
	if err != nil {
		return false
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return false
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return false
	}
	for _, ip := range ips {
		if !slices.ContainsFunc(cert.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

func ensureCA(certPath, keyPath, name string) (*x509.Certificate, crypto.Signer, error) {
	if exists(certPath) && exists(keyPath) {
		return loadPair(certPath, keyPath)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generating CA key: %w", err)
	}
	tmpl := x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, &tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("creating CA certificate: %w", err)
	}
	if err := writeKey(keyPath, key); err != nil {
		return nil, nil, err
	}
	if err := writePEM(certPath, "CERTIFICATE", der, 0o644); err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func writeLeaf(certPath, keyPath string, tmpl x509.Certificate, ca *x509.Certificate, caKey crypto.Signer) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating key for %s: %w", tmpl.Subject.CommonName, err)
	}
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().AddDate(10, 0, 0)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, ca, key.Public(), caKey)
	if err != nil {
		return fmt.Errorf("signing certificate for %s: %w", tmpl.Subject.CommonName, err)
	}
	if err := writeKey(keyPath, key); err != nil {
		return err
	}
	return writePEM(certPath, "CERTIFICATE", der, 0o644)
}

func loadPair(certPath, keyPath string) (*x509.Certificate, crypto.Signer, error) {
	certPEM, err := safefile.ReadFile(certPath)
	if err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", certPath, err)
	}
	keyPEM, err := safefile.ReadFile(keyPath)
	if err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", keyPath, err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, errors.New("ca files are not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing %s: %w", certPath, err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing %s: %w", keyPath, err)
	}
	return cert, key, nil
}

func writeKey(path string, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encoding key: %w", err)
	}
	return writePEM(path, "EC PRIVATE KEY", der, 0o600)
}

// writePEM writes atomically and durably (safefile) so a crash never leaves a half-written
// or lost key that a restart would then fail to parse or silently replace.
func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return safefile.Write(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return n
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
