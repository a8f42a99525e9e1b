package dataca

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/client-go/util/cert"

	"github.com/crdipc/crdipc/internal/storage/replica"
)

// Checked is a certificate request that is a data-path identity: what it names.
type Checked struct {
	Request *x509.CertificateRequest
	Role    Role
	Node    string
}

// CheckRequest parses the request of a CertificateSigningRequest for DataSigner and checks
// that it is a data-path identity at all: a common name role:node, IP addresses only for
// RoleNode, no DNS, e-mail or URI names, and only the usages of its role. Whether the
// requester may have it is the approver's question.
func CheckRequest(spec certificatesv1.CertificateSigningRequestSpec) (Checked, error) {
	block, _ := pem.Decode(spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return Checked{}, errors.New("the request is not a PEM CERTIFICATE REQUEST")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return Checked{}, fmt.Errorf("parsing the certificate request: %w", err)
	}
	if err := req.CheckSignature(); err != nil {
		return Checked{}, fmt.Errorf("the certificate request's signature: %w", err)
	}
	role, node, err := ParseCommonName(req.Subject.CommonName)
	if err != nil {
		return Checked{}, err
	}
	if len(req.DNSNames)+len(req.EmailAddresses)+len(req.URIs) > 0 {
		return Checked{}, errors.New("the request names DNS names, e-mail addresses or URIs: a data-path identity has none")
	}
	if role != RoleNode && len(req.IPAddresses) > 0 {
		return Checked{}, fmt.Errorf("a %s identity dials only: it has no IP addresses, the request names %v", role, req.IPAddresses)
	}
	allowed := Usages(role)
	for _, u := range spec.Usages {
		if !slices.Contains(allowed, u) {
			return Checked{}, fmt.Errorf("usage %q is not one of a %s identity's: %v", u, role, allowed)
		}
	}
	return Checked{Request: req, Role: role, Node: node}, nil
}

// Sign signs a checked request with ca (PEM): only its common name and IP addresses, the
// usages of its role, valid for the request's expirationSeconds but at most MaxValidity.
func Sign(ca replica.CA, spec certificatesv1.CertificateSigningRequestSpec, now time.Time) ([]byte, error) {
	if ca.Cert == nil || ca.Key == nil {
		return nil, errors.New("ca has no certificate or key")
	}
	c, err := CheckRequest(spec)
	if err != nil {
		return nil, err
	}
	validity := MaxValidity
	if spec.ExpirationSeconds != nil {
		validity = min(validity, time.Duration(*spec.ExpirationSeconds)*time.Second)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(math.MaxInt64))
	if err != nil {
		return nil, fmt.Errorf("generating serial: %w", err)
	}
	ext := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if c.Role == RoleNode {
		ext = append(ext, x509.ExtKeyUsageServerAuth)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial.Add(serial, big.NewInt(1)),
		Subject:      pkix.Name{CommonName: c.Request.Subject.CommonName},
		// Tolerate small clock skew between nodes.
		NotBefore:   now.Add(-5 * time.Minute).UTC(),
		NotAfter:    now.Add(validity).UTC(),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: ext,
		IPAddresses: c.Request.IPAddresses,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, c.Request.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("signing the certificate of %s: %w", tmpl.Subject.CommonName, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing the signed certificate: %w", err)
	}
	return cert.EncodeCertificates(leaf)
}
