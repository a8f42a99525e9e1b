// Package dataca keeps the certificate authority of the storage data path in a Secret and
// turns it into the TLS identities of the parts that move replica data.
//
// Control goes through custom resources; data goes through each node's replica data
// service, and only peers holding a certificate from this CA may read or write a replica.
// The storage operator creates the CA once (Ensure); node agents and the CSI node service
// read it (Load) and issue themselves a certificate for their own address (Identity). The CA
// key is therefore shared by the data-path components, as Kubernetes' own components share
// a cluster CA: whoever can read the Secret can join the data path, which is why the
// shipped roles grant get on this one Secret by name and nothing else in the namespace.
package dataca
