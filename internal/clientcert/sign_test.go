package clientcert_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"

	"github.com/crdipc/crdipc/internal/clientcert"
)

func testCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return ca, key
}

// A node's credential signed in process is the identity the CSR path issues: the kubelet's
// user and group, for client auth only, verifiable against the CA.
func TestSignNode(t *testing.T) {
	ca, caKey := testCA(t)
	issued, err := clientcert.Sign(ca, caKey, clientcert.NodeRequest("n1"))
	if err != nil {
		t.Fatal(err)
	}
	if issued.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName {
		t.Errorf("signer %q, want the kubelet client signer", issued.SignerName)
	}
	block, _ := pem.Decode(issued.Cert)
	if block == nil {
		t.Fatal("certificate is not PEM")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if cert.Subject.CommonName != "system:node:n1" || !slices.Equal(cert.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("subject %v, want system:node:n1 in system:nodes", cert.Subject)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the certificate does not verify as a client of the CA: %v", err)
	}
	if _, err := x509.ParseECPrivateKey(mustPEM(t, issued.Key)); err != nil {
		t.Errorf("key: %v", err)
	}
}

// The rules are Issue's: what the CSR path refuses, Sign refuses too, before signing.
func TestSignRefuses(t *testing.T) {
	ca, caKey := testCA(t)
	for _, tc := range []struct {
		r    clientcert.Request
		want string
	}{
		{clientcert.Request{}, "user name is required"},
		{clientcert.Request{User: "system:node:"}, "names no node"},
		{clientcert.Request{User: "system:node:n1", Groups: []string{"system:nodes", "extra"}}, "exactly the group"},
		{clientcert.Request{User: "someone", Groups: []string{"system:masters"}}, "system:masters"},
	} {
		_, err := clientcert.Sign(ca, caKey, tc.r)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Sign(%+v) = %v, want an error with %q", tc.r, err, tc.want)
		}
	}
}

func mustPEM(t *testing.T, data []byte) []byte {
	t.Helper()
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatal("not PEM")
	}
	return block.Bytes
}
