package controlplane

import (
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestJoinedListenerAcceptsOnEach: connections to either address reach the one Accept,
// and Close ends Accept and closes both.
func TestJoinedListenerAcceptsOnEach(t *testing.T) {
	a, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	j := joinListeners(a, b)
	if j.Addr() != a.Addr() {
		t.Errorf("Addr %s, want the first listener's %s", j.Addr(), a.Addr())
	}
	for _, l := range []net.Listener{a, b} {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := j.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if s.LocalAddr().String() != l.Addr().String() {
			t.Errorf("accepted on %s, want %s", s.LocalAddr(), l.Addr())
		}
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1)
		if _, err := io.ReadFull(s, buf); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	done := make(chan error, 1)
	go func() { _, err := j.Accept(); done <- err }()
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept still blocked after Close")
	}
	if _, err := net.Dial("tcp", b.Addr().String()); err == nil {
		t.Error("the second listener still accepts after Close")
	}
}

// TestServingCertificateNamesAdvertiseAddress: a serving certificate that lacks an
// advertise address is issued again from the same CA; one that names it is kept.
func TestServingCertificateNamesAdvertiseAddress(t *testing.T) {
	p := newPKI(filepath.Join(t.TempDir(), "pki"))
	if err := p.ensure(); err != nil {
		t.Fatal(err)
	}
	ip := net.ParseIP("10.88.0.1")
	if certNamesIPs(p.servingCert, []net.IP{ip}) {
		t.Fatal("a fresh serving certificate names 10.88.0.1")
	}
	ca, _, err := loadPair(p.caCert, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ensure(ip); err != nil {
		t.Fatal(err)
	}
	if !certNamesIPs(p.servingCert, []net.IP{ip, net.ParseIP("127.0.0.1")}) {
		t.Fatal("the serving certificate does not name the advertise address after ensure")
	}
	ca2, _, err := loadPair(p.caCert, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	if !ca.Equal(ca2) {
		t.Fatal("the CA changed")
	}
	cert, _, err := loadPair(p.servingCert, p.servingKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := cert.CheckSignatureFrom(ca); err != nil {
		t.Fatalf("the new serving certificate is not the CA's: %v", err)
	}
	if err := p.ensure(ip); err != nil {
		t.Fatal(err)
	}
	again, _, err := loadPair(p.servingCert, p.servingKey)
	if err != nil {
		t.Fatal(err)
	}
	if !again.Equal(cert) {
		t.Error("a serving certificate that names the address was issued again")
	}
}
