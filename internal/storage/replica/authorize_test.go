package replica

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// A server with Authorize serves a replica only to the peers it allows: another peer, holding
// a certificate from the same CA, is refused with ErrForbidden, on the replica and on its
// snapshots, and the connection stays usable for what it may use.
func TestServerRefusesPeersAuthorizeRefuses(t *testing.T) {
	pki := newTestPKI(t)
	n := newTestNode(t, pki, "node-a")
	n.create("ns/vol-a", 1<<20)
	n.create("ns/other", 1<<20)
	n.tweak = func(s *Server) {
		s.o.Authorize = func(peer, id string) error {
			base, _, _ := SplitSnapshotID(id)
			if peer == "member" || base == "ns/other" {
				return nil
			}
			return fmt.Errorf("%s holds no replica of its volume", peer)
		}
	}
	n.start()
	dial := func(cn string) *Conn {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := Dial(ctx, n.addr, ClientTLSConfig(pki.ca.Pool(), pki.cert(t, cn)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx := ctxT(t)

	if _, err := dial("member").Replica("ns/vol-a").Info(ctx); err != nil {
		t.Fatalf("a member: %v", err)
	}
	stranger := dial("stranger")
	_, err := stranger.Replica("ns/vol-a").Info(ctx)
	if !errors.Is(err, ErrForbidden) {
		t.Fatalf("a non-member: %v, want ErrForbidden", err)
	}
	t.Logf("refused: %v", err)
	if _, err := stranger.Replica(SnapshotID("ns/vol-a", "s1")).Info(ctx); !errors.Is(err, ErrForbidden) {
		t.Errorf("a non-member reading a snapshot: %v, want ErrForbidden", err)
	}
	if err := stranger.Replica("ns/vol-a").DeleteSnapshot(ctx, "s1"); !errors.Is(err, ErrForbidden) {
		t.Errorf("a non-member deleting a snapshot: %v, want ErrForbidden", err)
	}
	if _, err := stranger.Replica("ns/other").Info(ctx); err != nil {
		t.Errorf("a replica the peer may use, on the same connection: %v", err)
	}
}
