package bitcoin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/btcsuite/btcd/btcjson"

	bitcoinv1alpha1 "github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
	"github.com/crdipc/crdipc/internal/bitcoin/btcd"
	"github.com/crdipc/crdipc/internal/testenv"
	"github.com/crdipc/crdipc/internal/testenv/require"
	"github.com/crdipc/crdipc/internal/testenv/wait"
)

// btcdNode is a btcd process on 127.0.0.1 for one test.
type btcdNode struct {
	p2p, rpc int32
}

// startBtcd runs a regtest btcd on free 127.0.0.1 ports with RPC credentials user/pass:
// over TLS, as btcd pods serve it, or plain with --notls, which btcd allows on loopback only
// (how the simulated nodes run bitcoind pods).
func startBtcd(t *testing.T, tls bool) btcdNode {
	t.Helper()
	bin, err := (btcd.Image{}).Find()
	require.Capable(t, "CRDIPC_REQUIRE_BTCD", err)
	home := t.TempDir()
	n := btcdNode{p2p: freePort(t), rpc: freePort(t)}
	args := []string{"--regtest", "--nodnsseed",
		fmt.Sprintf("--listen=127.0.0.1:%d", n.p2p), fmt.Sprintf("--rpclisten=127.0.0.1:%d", n.rpc),
		"--rpcuser=user", "--rpcpass=pass",
		// Its own files, by flag: btcd finds its default home through the user database,
		// not $HOME, so two nodes of one test would share (and lock) root's chain.
		"--datadir=" + filepath.Join(home, "data"), "--logdir=" + filepath.Join(home, "logs"),
		"--rpccert=" + filepath.Join(home, "rpc.cert"), "--rpckey=" + filepath.Join(home, "rpc.key")}
	if !tls {
		args = append(args, "--notls")
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"HOME=" + home}
	out, err := os.Create(filepath.Join(home, "out.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		out.Close()
		if t.Failed() {
			log, _ := os.ReadFile(out.Name())
			t.Logf("btcd on rpc port %d:\n%s", n.rpc, log)
		}
	})
	return n
}

func freePort(t *testing.T) int32 {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return int32(l.Addr().(*net.TCPAddr).Port)
}

// The two RPC dialects against real btcd processes: btcd's TLS-only RPC (the btcd
// implementation's client) and plain HTTP (the bitcoind implementation's client); btcd's
// answers to addnode for a peer already connected; its refusal of wrong credentials.
func TestRPCDialectsAgainstBtcd(t *testing.T) {
	a, b := startBtcd(t, true), startBtcd(t, false)
	transports := newRPCTransports(5 * time.Second)
	overTLS := transports.client(bitcoinv1alpha1.ImplementationBtcd, "user", "pass")
	plain := transports.client(bitcoinv1alpha1.ImplementationBitcoind, "user", "pass")
	ctx := context.Background()

	// Both answer once started (btcd makes its key pair first).
	testenv.Eventually(t, 30*time.Second, "both nodes answering getpeerinfo", func(ctx context.Context) (bool, error) {
		if _, err := overTLS.peerHosts(ctx, "127.0.0.1", a.rpc); err != nil {
			return false, err
		}
		_, err := plain.peerHosts(ctx, "127.0.0.1", b.rpc)
		return err == nil, err
	})
	// The wrong dialect fails, saying so, rather than reading as no peers.
	if _, err := plain.peerHosts(ctx, "127.0.0.1", a.rpc); err == nil {
		t.Error("plain HTTP to btcd's TLS RPC port succeeded")
	}
	if _, err := transports.client(bitcoinv1alpha1.ImplementationBtcd, "user", "wrong").peerHosts(ctx, "127.0.0.1", a.rpc); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong password: %v, want the node's refusal (401)", err)
	}

	peer := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(b.p2p)))
	if err := overTLS.addNode(ctx, "127.0.0.1", a.rpc, peer); err != nil {
		t.Fatalf("addnode: %v", err)
	}
	// Linked as both see it: the dialler by the address it dialled, the other by the
	// dialler's address, whose port is an ephemeral one.
	err := wait.Until(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		seenByA, err := overTLS.peerHosts(ctx, "127.0.0.1", a.rpc)
		if err != nil {
			return false, err
		}
		seenByB, err := plain.peerHosts(ctx, "127.0.0.1", b.rpc)
		if err != nil {
			return false, err
		}
		if !seenByA["127.0.0.1"] || !seenByB["127.0.0.1"] {
			return false, fmt.Errorf("peers: a %v, b %v", seenByA, seenByB)
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the nodes never linked: %v", err)
	}
	// btcd answers -8 "peer already connected" to a second add: addNode takes it as done.
	var re rpcError
	err = overTLS.call(ctx, "127.0.0.1", a.rpc, "addnode", nil, peer, "add")
	if !errors.As(err, &re) || re.Code != btcjson.ErrRPCInvalidParameter || !strings.Contains(re.Message, "already connected") {
		t.Fatalf("a second raw addnode: %v, want btcd's -8 peer already connected", err)
	}
	if err := overTLS.addNode(ctx, "127.0.0.1", a.rpc, peer); err != nil {
		t.Errorf("a second addNode: %v, want nil", err)
	}
	// Other addnode errors are errors.
	if err := overTLS.addNode(ctx, "127.0.0.1", a.rpc, peer[:len(peer)-1]+"x"); err == nil {
		t.Error("addnode of an address with a bad port: nil error")
	}
}
