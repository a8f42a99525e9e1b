package btcd

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
)

// PeerHosts asks the btcd node whose TLS JSON-RPC listens at addr (host:port) for
// getpeerinfo, and returns the hosts of its peers. It is how tests see the links with their
// own eyes rather than through the operator's status. The node's certificate is one it
// made itself on start, which no one else holds: it is not verified (as by the operator;
// the password authenticates).
func PeerHosts(ctx context.Context, addr, user, pass string) (map[string]bool, error) {
	body := []byte(`{"jsonrpc":"1.0","id":1,"method":"getpeerinfo","params":[]}`)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+addr, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(user, pass)
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // the node's self-made certificate
	defer tr.CloseIdleConnections()
	res, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("getpeerinfo on %s: %w", addr, err)
	}
	defer res.Body.Close()
	var reply struct {
		Result []struct {
			Addr string `json:"addr"`
		} `json:"result"`
		Error *struct{ Message string } `json:"error"`
	}
	if err := json.NewDecoder(res.Body).Decode(&reply); err != nil {
		return nil, fmt.Errorf("getpeerinfo on %s: HTTP %d: %w", addr, res.StatusCode, err)
	}
	if reply.Error != nil {
		return nil, fmt.Errorf("getpeerinfo on %s: %s", addr, reply.Error.Message)
	}
	hosts := map[string]bool{}
	for _, p := range reply.Result {
		if h, _, err := net.SplitHostPort(p.Addr); err == nil {
			hosts[h] = true
		}
	}
	return hosts, nil
}
