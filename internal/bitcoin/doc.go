// Package bitcoin is the BitcoinNetwork operator of seed 002: the controller pattern applied
// to a small network of Bitcoin nodes that must know each other. spec.implementation picks
// the node program, bitcoind or btcd; their flags, RPC ports and RPC transport differ
// (btcd's RPC is TLS-only off loopback), their peer-to-peer protocol does not.
//
// For each BitcoinNetwork the operator keeps, owned by it (so deleting the network deletes
// them):
//
//   - a Secret <name>-rpc with generated RPC credentials, unless spec.secretName names one;
//   - a headless Service <name> giving each node a stable DNS name;
//   - a StatefulSet <name> of spec.nodes node pods, updated when the spec changes.
//
// It watches the pods and, whenever one becomes ready, introduces it to the others over the
// node's JSON-RPC interface (addnode … add), then counts the links it sees (getpeerinfo).
// The status reports every node (pod, IP, ready), readyNodes, peers (connected pairs) and
// Ready=True once every node is ready and connected to every other. A network is checked
// again every Resync, since a node forgets added nodes when it restarts.
package bitcoin
