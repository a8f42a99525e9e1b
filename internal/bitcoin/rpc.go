package bitcoin

import (
	"bytes"
	"context"
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
)

// rpcClient calls bitcoind's JSON-RPC interface. The request and reply types are btcd's
// btcjson (the same wire format bitcoind uses); the transport is our own so that every call
// has the caller's context and a deadline: rpcclient retries a failed POST for minutes, which
// would hold a reconcile worker while a pod is down.
type rpcClient struct {
	http       *http.Client
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
	url := "http://" + net.JoinHostPort(host, strconv.Itoa(int(port))) + "/"
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
// is not an error: bitcoind answers -23 "already added", btcd "already connected".
func (c *rpcClient) addNode(ctx context.Context, host string, port int32, peer string) error {
	err := c.call(ctx, host, port, "addnode", nil, peer, "add")
	var re rpcError
	if errors.As(err, &re) && (re.Code == btcjson.ErrRPCClientNodeAlreadyAdded || alreadyConnected(re.Message)) {
		return nil
	}
	return err
}

func alreadyConnected(msg string) bool { return strings.Contains(msg, "already") }

func newRPCClient(user, pass string, timeout time.Duration) *rpcClient {
	return &rpcClient{http: &http.Client{Timeout: timeout}, user: user, pass: pass}
}
