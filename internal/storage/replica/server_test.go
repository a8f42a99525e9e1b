package replica

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/testenv/wait"
)

func TestRefusesClientsWithoutTrustedCertificate(t *testing.T) {
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.create("ns/r1", 1<<20)
	n.start()

	ctx := ctxT(t)
	other := newTestPKI(t)
	for name, conf := range map[string]*tls.Config{
		"no certificate":         {RootCAs: pki.ca.Pool(), MinVersion: tls.VersionTLS13},
		"certificate of another": ClientTLSConfig(pki.ca.Pool(), other.cert(t, "intruder")),
	} {
		t.Run(name, func(t *testing.T) {
			c, err := Dial(ctx, n.addr, conf)
			if err == nil {
				// Should not happen; make sure nothing is served either.
				_, ierr := c.Replica("ns/r1").Info(ctx)
				c.Close()
				t.Fatalf("dial succeeded (info error: %v)", ierr)
			}
			t.Logf("refused: %v", err)
		})
	}
	t.Run("server of another ca", func(t *testing.T) {
		if _, err := Dial(ctx, n.addr, ClientTLSConfig(other.ca.Pool(), other.cert(t, "c"))); err == nil {
			t.Fatal("client accepted a server certificate from an untrusted ca")
		}
	})
	t.Run("trusted", func(t *testing.T) {
		c := n.dial(t)
		if _, err := c.Replica("ns/r1").Info(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestReadWriteExtentsAndErrors(t *testing.T) {
	const size = 64 << 20
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.create("ns/r1", size)
	n.start()
	ctx := ctxT(t)
	c := n.dial(t)
	r := c.Replica("ns/r1")

	_, err := c.Replica("ns/nope").Info(ctx)
	mustBe(t, err, ErrNotFound)
	mustBe(t, r.WriteAt(ctx, make([]byte, 4096), 0, 1), ErrNoSession)
	mustBe(t, r.Flush(ctx), ErrNoSession)

	in, err := r.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !in.Dirty || in.Size != size || in.Revision != 0 || in.Epoch != 1 {
		t.Fatalf("info after open: %+v", in)
	}

	writes := []struct {
		off int64
		n   int
	}{{0, 4096}, {8 << 20, 1 << 20}, {32<<20 + 4096, 9 << 20}} // the last is split in pieces
	for i, w := range writes {
		b := make([]byte, w.n)
		pattern(b, uint64(i))
		if err := r.WriteAt(ctx, b, w.off, uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	for i, w := range writes {
		want := make([]byte, w.n)
		pattern(want, uint64(i))
		got := make([]byte, w.n)
		if err := r.ReadAt(ctx, got, w.off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("write %d read back differently", i)
		}
	}
	hole := make([]byte, 64<<10)
	hole[0] = 1
	if err := r.ReadAt(ctx, hole, 16<<20); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(hole, make([]byte, len(hole))) {
		t.Fatal("hole did not read as zeros")
	}

	exts, err := r.Extents(ctx, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	want := []Extent{{0, 4096}, {8 << 20, 1 << 20}, {32<<20 + 4096, 9 << 20}}
	if !reflect.DeepEqual(exts, want) {
		t.Fatalf("extents %v, want %v", exts, want)
	}
	exts, err = r.Extents(ctx, 8<<20+4096, 8192)
	if err != nil || !reflect.DeepEqual(exts, []Extent{{8<<20 + 4096, 8192}}) {
		t.Fatalf("clipped extents %v, %v", exts, err)
	}
	if got, max := blocks(t, n.path("ns/r1")), int64(11<<20); got > max {
		t.Fatalf("replica file allocates %d bytes, want at most %d (not sparse)", got, max)
	}
	in, err = r.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if in.Revision != 3 || in.Allocated < 10<<20 || in.Allocated > 11<<20 {
		t.Fatalf("info after writes: %+v", in)
	}

	mustBe(t, r.WriteAt(ctx, make([]byte, 100), 0, 4), ErrInvalid)
	mustBe(t, r.WriteAt(ctx, make([]byte, 512), 7, 4), ErrInvalid)
	mustBe(t, r.WriteAt(ctx, make([]byte, 4096), size-512, 4), ErrInvalid)
	mustBe(t, r.ReadAt(ctx, make([]byte, 4096), size-512), ErrInvalid)

	// An oversized frame is refused and the connection stays usable.
	big := make([]byte, MaxPayload+512)
	_, err = c.roundTrip(ctx, &call{h: reqHeader{op: opWrite, arg: 9}, replica: "ns/r1", payload: big})
	mustBe(t, err, ErrTooLarge)
	if err := r.ReadAt(ctx, make([]byte, 4096), 0); err != nil {
		t.Fatalf("connection unusable after an oversized frame: %v", err)
	}

	if err := r.CloseSession(ctx); err != nil {
		t.Fatal(err)
	}
	mustBe(t, r.WriteAt(ctx, make([]byte, 512), 0, 5), ErrNoSession)
}

func TestRevisionAndDirtyDurableAcrossRestart(t *testing.T) {
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.create("ns/r1", 8<<20)
	n.create("ns/r2", 8<<20)
	n.start()
	ctx := ctxT(t)
	c := n.dial(t)
	r1, r2 := c.Replica("ns/r1"), c.Replica("ns/r2")
	for _, r := range []*Client{r1, r2} {
		if _, err := r.Open(ctx); err != nil {
			t.Fatal(err)
		}
		if err := r.WriteAt(ctx, make([]byte, 4096), 0, 7); err != nil {
			t.Fatal(err)
		}
	}
	if err := r1.Flush(ctx); err != nil { // r1: flushed at 7, writer vanishes
		t.Fatal(err)
	}
	if err := r2.WriteAt(ctx, make([]byte, 4096), 4096, 9); err != nil {
		t.Fatal(err)
	}
	if err := r2.CloseSession(ctx); err != nil { // r2: clean close at 9
		t.Fatal(err)
	}
	c.Close()
	n.stop()

	n.start()
	c = n.dial(t)
	for id, want := range map[string]Info{
		"ns/r1": {Revision: 7, Dirty: true, Epoch: 1},
		"ns/r2": {Revision: 9, Dirty: false, Epoch: 1},
	} {
		in, err := c.Replica(id).Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if in.Revision != want.Revision || in.Dirty != want.Dirty || in.Epoch != want.Epoch || in.Rebuilding {
			t.Errorf("%s after restart: %+v, want %+v", id, in, want)
		}
	}
}

func TestOpenIsExclusive(t *testing.T) {
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.create("ns/r1", 1<<20)
	n.start()
	ctx := ctxT(t)
	c1, c2 := n.dial(t), n.dial(t)
	if _, err := c1.Replica("ns/r1").Open(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Replica("ns/r1").Open(ctx); err != nil {
		t.Fatalf("reopen on the same connection: %v", err)
	}
	_, err := c2.Replica("ns/r1").Open(ctx)
	mustBe(t, err, ErrBusy)
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != statusBusy {
		t.Fatalf("busy error is not a RemoteError: %#v", err)
	}
	mustBe(t, c2.Replica("ns/r1").WriteAt(ctx, make([]byte, 512), 0, 1), ErrNoSession)

	c1.Close()
	wait.Eventually(t, 10*time.Second, "the first session to end", func(context.Context) (bool, error) {
		_, err := c2.Replica("ns/r1").Open(ctx)
		if err != nil && !errors.Is(err, ErrBusy) {
			t.Fatal(err)
		}
		return err == nil, err
	})
	if err := c2.Replica("ns/r1").WriteAt(ctx, make([]byte, 512), 0, 1); err != nil {
		t.Fatal(err)
	}
	// A closed Conn fails fast.
	_, err = c1.Replica("ns/r1").Info(ctx)
	mustBe(t, err, ErrClosed)
	in, err := c2.Replica("ns/r1").Info(ctx)
	if err != nil || in.Epoch != 2 {
		t.Fatalf("info %+v, %v; want epoch 2", in, err)
	}
}

func TestChooseSource(t *testing.T) {
	for _, tc := range []struct {
		name  string
		infos []Info
		want  int
		ok    bool
	}{
		{"none", nil, -1, false},
		{"all rebuilding", []Info{{Revision: 5, Rebuilding: true}, {Rebuilding: true}}, -1, false},
		{"single", []Info{{Revision: 3}}, 0, true},
		{"highest revision", []Info{{Revision: 3}, {Revision: 5}, {Revision: 4}}, 1, true},
		{"rebuilding never wins", []Info{{Revision: 3}, {Revision: 9, Rebuilding: true}}, 0, true},
		{"dirty higher wins over clean lower", []Info{{Revision: 3}, {Revision: 4, Dirty: true}}, 1, true},
		{"tie prefers clean", []Info{{Revision: 4, Dirty: true}, {Revision: 4}, {Revision: 4}}, 1, true},
		{"tie of dirty keeps first", []Info{{Revision: 4, Dirty: true}, {Revision: 4, Dirty: true}}, 0, true},
		{"tie of clean keeps first", []Info{{Revision: 2}, {Revision: 2}}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ChooseSource(tc.infos)
			if got != tc.want || ok != tc.ok {
				t.Fatalf("ChooseSource = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestPEMRoundTrip(t *testing.T) {
	pki := newTestPKI(t)
	certPEM, keyPEM, err := pki.ca.EncodePEM()
	if err != nil {
		t.Fatal(err)
	}
	ca, err := ParseCA(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !ca.Cert.Equal(pki.ca.Cert) {
		t.Fatal("ca certificate changed")
	}
	leaf, err := ca.Issue("n", []net.IP{loopback}, []string{"node-a"})
	if err != nil {
		t.Fatal(err)
	}
	cp, kp, err := EncodeCertificate(leaf)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseCertificate(cp, kp)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := back.Leaf.Verify(x509.VerifyOptions{Roots: pki.ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("issued certificate does not verify against the parsed ca: %v", err)
	}
	if _, err := ParseCA(certPEM, kp); err == nil {
		t.Fatal("ParseCA accepted a key that does not match")
	}
}
