// Package clientcert issues client certificates through the Kubernetes API: it creates a
// CertificateSigningRequest for an identity, approves it as the caller, waits for the
// cluster's signer to answer in the request's status, and writes a kubeconfig that
// authenticates with the certificate.
//
// It is how a real node joins `crdipc up` (crdipc kubeconfig --user system:node:NAME):
// the kubelet acts as system:node:NAME in group system:nodes, which the Node authorizer and
// the NodeRestriction admission plugin confine to that node's own objects. The request is
// an object and its answer is in its status, as every request in crdipc; the CA's key
// stays with the control plane's signer (kube-controller-manager's CSR signing controller).
//
// Sign issues the same identities in process, for the control plane's own clients (up's
// simulated kubelets), which hold the CA's key: one set of rules for who a node is,
// whichever way its credential comes.
package clientcert
