package bitcoin

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/btcsuite/btcd/btcjson"

	bitcoinv1alpha1 "github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
)

// rpcClient calls a node's JSON-RPC interface, bitcoind's or btcd's. The request and reply
// types are btcd's btcjson (the same wire format bitcoind uses); the transport is our own so
// that every call has the caller's context and a deadline: rpcclient retries a failed POST
// for minutes, which would hold a reconcile worker while a pod is down.
type rpcClient struct {
	http       *http.Client
	scheme     string // http for bitcoind, https for btcd
	user, pass string
}

// rpcError is an error reply of the node, e.g. -23 "Node already added".
type rpcError struct{ *btcjson.RPCError }

func (e rpcError) Error() string { return fmt.Sprintf("rpc error %d: %s", e.Code, e.Message) }

// call invokes method on the node at host:port and decodes its result into result (if not nil).
func (c *rpcClient) call(ctx context.Context, host string, port int32, method string, result any, params ...any) error {
	req, err := btcjson.NewRequest(btcjson.RpcVersion1, 1, method, params)
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	url := c.scheme + "://" + net.JoinHostPort(host, strconv.Itoa(int(port))) + "/"
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	hreq.SetBasicAuth(c.user, c.pass)
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(hreq)
	if err != nil {
		return fmt.Errorf("%s on %s: %w", method, host, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("%s on %s: reading reply: %w", method, host, err)
	}
	if resp.StatusCode == http.StatusUnauthorized {
		return fmt.Errorf("%s on %s: the node refused the RPC credentials (401)", method, host)
	}
	// bitcoind answers RPC errors with 500 and a JSON body; btcd with 200.
	var reply btcjson.Response
	if err := json.Unmarshal(raw, &reply); err != nil {
		return fmt.Errorf("%s on %s: HTTP %d, not a JSON-RPC reply: %.200q", method, host, resp.StatusCode, raw)
	}
	if reply.Error != nil {
		return fmt.Errorf("%s on %s: %w", method, host, rpcError{reply.Error})
	}
	if result == nil {
		return nil
	}
	if err := json.Unmarshal(reply.Result, result); err != nil {
		return fmt.Errorf("%s on %s: decoding result: %w", method, host, err)
	}
	return nil
}

// peerHosts are the IPs a node is connected to, inbound or outbound.
func (c *rpcClient) peerHosts(ctx context.Context, host string, port int32) (map[string]bool, error) {
	var peers []btcjson.GetPeerInfoResult
	if err := c.call(ctx, host, port, "getpeerinfo", &peers); err != nil {
		return nil, err
	}
	hosts := make(map[string]bool, len(peers))
	for _, p := range peers {
		if h, _, err := net.SplitHostPort(p.Addr); err == nil {
			hosts[h] = true
		}
	}
	return hosts, nil
}

// addNode asks the node at host to keep a connection to peer (addnode … add). Asking again
// is not an error: bitcoind answers -23 "Node already added"; btcd -8 "peer already
// connected", and only while the peer is connected (a lost peer it is still redialling,
// with back-off of up to 5 min, takes the request again and is dialled at once).
func (c *rpcClient) addNode(ctx context.Context, host string, port int32, peer string) error {
	err := c.call(ctx, host, port, "addnode", nil, peer, "add")
	var re rpcError
	if errors.As(err, &re) && (re.Code == btcjson.ErrRPCClientNodeAlreadyAdded ||
		re.Code == btcjson.ErrRPCInvalidParameter && strings.Contains(re.Message, "already connected")) {
		return nil
	}
	return err
}

// rpcTransports are the HTTP clients of the two RPC dialects, made once so that their
// connections are reused across reconciles.
type rpcTransports struct{ plain, tls *http.Client }

func newRPCTransports(timeout time.Duration) rpcTransports {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// btcd serves RPC off loopback only over TLS, with a self-signed certificate it makes
	// on first start and no one else holds: there is nothing to verify it against. TLS
	// keeps the password from eavesdroppers, not from one who impersonates the pod IP:
	// no weaker than bitcoind's RPC, which is plain HTTP.
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true} //nolint:gosec // see above
	return rpcTransports{plain: &http.Client{Timeout: timeout}, tls: &http.Client{Timeout: timeout, Transport: tr}}
}

// client is the RPC client of an implementation's nodes with these credentials.
func (t rpcTransports) client(impl bitcoinv1alpha1.Implementation, user, pass string) *rpcClient {
	if impl == bitcoinv1alpha1.ImplementationBtcd {
		return &rpcClient{http: t.tls, scheme: "https", user: user, pass: pass}
	}
	return &rpcClient{http: t.plain, scheme: "http", user: user, pass: pass}
}
