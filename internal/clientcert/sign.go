package clientcert

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"time"
)

// Sign issues r's certificate with the CA's key in hand, valid for a year. It is for the
// control plane's own in-process clients (up's simulated kubelets and services), which run
// where the CA key is and must not wait for the CSR signer; every other client goes
// through Issue. Both apply the same rules to r (who a node is, which groups are refused)
// and make the same key and subject, so a credential means the same whichever way it came.
func Sign(ca *x509.Certificate, caKey crypto.Signer, r Request) (*Issued, error) {
	if err := r.validate(); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	duration := r.Duration
	if duration <= 0 {
		duration = 365 * 24 * time.Hour // the CSR signer's default
	}
	tmpl := x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: r.User, Organization: r.Groups},
		// An hour back: a clock a little behind the API server's still accepts it.
		NotBefore:   time.Now().Add(-time.Hour),
		NotAfter:    time.Now().Add(duration),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, ca, key.Public(), caKey)
	if err != nil {
		return nil, fmt.Errorf("signing: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding key: %w", err)
	}
	return &Issued{
		Cert:          pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:           pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		SignerName:    r.signer(),
		RequestedUser: r.User,
	}, nil
}
