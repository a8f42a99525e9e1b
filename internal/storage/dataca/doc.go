// Package dataca is the certificate authority of the storage data path, and how the parts
// that move replica data obtain their TLS identities from it.
//
// Control goes through custom resources; data goes through each node's replica data
// service, and only peers holding a certificate from this CA may read or write a replica.
// The storage operator alone holds the CA key, in a Secret only it may read (Ensure, Load),
// and publishes the CA certificate, without the key, in a ConfigMap (Publish, LoadTrust).
// A node agent or CSI node service generates a key that never leaves its process and asks
// for a certificate naming its own node through a CertificateSigningRequest for signer
// DataSigner (Obtain); the operator approves a request only when the requester is that
// node (its kubelet, or a node-side ServiceAccount whose token is bound to the node) and
// signs approved ones. So a node can be no other node on the data path, and a replica
// server can tell from a peer's certificate which node it is (ParseCommonName).
package dataca
