package target

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/crdipc/crdipc/internal/localsock"
)

// TestLocalMemberFallsBackToTLS: the replica on the target's node is reached over TLS when
// its server's local socket cannot be used — there is none, or the one there answers for
// another node — and the reason is reported; over the socket when it can.
func TestLocalMemberFallsBackToTLS(t *testing.T) {
	c := newClusterWrapped(t, nil, linkTLS)
	n := c.nodes[0]
	other, err := localsock.Listen("unix", n.dir+"/other.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	go func() {
		for {
			conn, err := other.AcceptUnix()
			if err != nil {
				return
			}
			_ = localsock.Admit(conn, other.Token, "node-elsewhere", 5*time.Second)
			conn.Close()
		}
	}()
	for _, tc := range []struct{ name, socket, why string }{
		{"no socket", n.dir + "/missing.sock", "no such file"},
		{"another node's socket", other.Addr().String(), `serves node "node-elsewhere"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reasons []error
			m := LocalMember(c.ids[0], n.addr, c.client, LocalLink{Socket: tc.socket, Node: n.name, Dialed: func(err error) { reasons = append(reasons, err) }})
			if !m.Local {
				t.Error("a LocalMember is not Local")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := m.Dial(ctx)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer r.(interface{ Close() error }).Close()
			if _, err := r.Info(ctx); err != nil {
				t.Fatalf("info over the fallback: %v", err)
			}
			if len(reasons) != 1 || reasons[0] == nil || !strings.Contains(reasons[0].Error(), tc.why) {
				t.Fatalf("reported %v, want one fallback saying %q", reasons, tc.why)
			}
		})
	}
}
