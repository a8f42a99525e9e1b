package replica

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net"
	"time"

	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// ALPN is the application protocol negotiated on every replica connection. A peer speaking
// another protocol version fails at the handshake instead of misreading frames.
const ALPN = "crdipc-replica/1"

// CertValidity is how long an issued leaf certificate is valid. The CA (from
// cert.NewSelfSignedCACert) is valid for ten years.
const CertValidity = 365 * 24 * time.Hour

// CA is the certificate authority that node certificates are issued from. Whoever holds its
// key can join the data plane, so it lives in a Secret.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
}

// NewCA creates a self-signed CA with an ECDSA P-256 key.
func NewCA() (CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return CA{}, fmt.Errorf("generating ca key: %w", err)
	}
	c, err := cert.NewSelfSignedCACert(cert.Config{CommonName: "crdipc-replica-ca"}, key)
	if err != nil {
		return CA{}, fmt.Errorf("creating ca certificate: %w", err)
	}
	return CA{Cert: c, Key: key}, nil
}

// Pool returns a pool holding only this CA, for ServerTLSConfig and ClientTLSConfig.
func (ca CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue returns a certificate signed by ca that is valid both as a server and as a client
// certificate: a node agent serves its replicas and, when rebuilding, dials its peers with
// the same identity.
func (ca CA) Issue(commonName string, ips []net.IP, dnsNames []string) (tls.Certificate, error) {
	if ca.Cert == nil || ca.Key == nil {
		return tls.Certificate{}, errors.New("ca has no certificate or key")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generating key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(math.MaxInt64))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generating serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial.Add(serial, big.NewInt(1)),
		Subject:      pkix.Name{CommonName: commonName},
		// Tolerate small clock skew between nodes.
		NotBefore:   now.Add(-5 * time.Minute).UTC(),
		NotAfter:    now.Add(CertValidity).UTC(),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: ips,
		DNSNames:    dnsNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("signing certificate for %q: %w", commonName, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("parsing issued certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// EncodePEM returns the CA certificate and key as PEM, e.g. for the keys of a Secret.
func (ca CA) EncodePEM() (certPEM, keyPEM []byte, err error) {
	if ca.Cert == nil || ca.Key == nil {
		return nil, nil, errors.New("ca has no certificate or key")
	}
	certPEM, err = cert.EncodeCertificates(ca.Cert)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding ca certificate: %w", err)
	}
	keyPEM, err = keyutil.MarshalPrivateKeyToPEM(ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("encoding ca key: %w", err)
	}
	return certPEM, keyPEM, nil
}

// ParseCA is the inverse of CA.EncodePEM.
func ParseCA(certPEM, keyPEM []byte) (CA, error) {
	certs, err := cert.ParseCertsPEM(certPEM)
	if err != nil {
		return CA{}, fmt.Errorf("parsing ca certificate: %w", err)
	}
	if !certs[0].IsCA {
		return CA{}, errors.New("certificate is not a ca")
	}
	k, err := keyutil.ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return CA{}, fmt.Errorf("parsing ca key: %w", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return CA{}, fmt.Errorf("ca key of type %T cannot sign", k)
	}
	if err := sameKey(certs[0], signer); err != nil {
		return CA{}, err
	}
	return CA{Cert: certs[0], Key: signer}, nil
}

func sameKey(c *x509.Certificate, k crypto.Signer) error {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	pub, ok := k.Public().(equaler)
	if !ok || !pub.Equal(c.PublicKey) {
		return errors.New("ca key does not match ca certificate")
	}
	return nil
}

// EncodeCertificate returns an issued certificate (chain) and its key as PEM.
func EncodeCertificate(c tls.Certificate) (certPEM, keyPEM []byte, err error) {
	if len(c.Certificate) == 0 {
		return nil, nil, errors.New("empty certificate")
	}
	var certs []*x509.Certificate
	for _, der := range c.Certificate {
		x, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, nil, fmt.Errorf("parsing certificate: %w", err)
		}
		certs = append(certs, x)
	}
	if certPEM, err = cert.EncodeCertificates(certs...); err != nil {
		return nil, nil, fmt.Errorf("encoding certificate: %w", err)
	}
	if keyPEM, err = keyutil.MarshalPrivateKeyToPEM(c.PrivateKey); err != nil {
		return nil, nil, fmt.Errorf("encoding key: %w", err)
	}
	return certPEM, keyPEM, nil
}

// ParseCertificate is the inverse of EncodeCertificate.
func ParseCertificate(certPEM, keyPEM []byte) (tls.Certificate, error) {
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("parsing certificate and key: %w", err)
	}
	return c, nil
}

// ServerTLSConfig is the configuration of a replica server: TLS 1.3 only, and every client
// must present a certificate issued by a CA in ca.
func ServerTLSConfig(ca *x509.CertPool, c tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{c},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca,
		NextProtos:   []string{ALPN},
	}
}

// ClientTLSConfig is the configuration for Dial: it presents c and trusts servers whose
// certificate was issued by a CA in ca. The server name is taken from the dialed address, so
// server certificates must carry the IP (or DNS name) that peers dial.
func ClientTLSConfig(ca *x509.CertPool, c tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{c},
		RootCAs:      ca,
		NextProtos:   []string{ALPN},
	}
}
