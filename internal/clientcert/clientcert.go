package clientcert

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/client-go/util/keyutil"
)

// Request says whose certificate to issue.
type Request struct {
	// User is the certificate's common name, the user the API server authenticates.
	User string
	// Groups are the certificate's organizations, the user's groups.
	Groups []string
	// Duration is how long the certificate is valid; the signer may shorten it
	// (kube-controller-manager's --cluster-signing-duration, a year by default). 0 asks
	// for the signer's default.
	Duration time.Duration
}

const (
	nodeUserPrefix = "system:node:"
	nodesGroup     = "system:nodes"
)

// NodeRequest is the identity of node's kubelet: system:node:<node> in group system:nodes.
func NodeRequest(node string) Request {
	return Request{User: nodeUserPrefix + node, Groups: []string{nodesGroup}}
}

// signer is the signer a request goes to: a node's client certificate goes to the kubelet
// client signer, whose certificates the API server trusts only for that shape of identity;
// any other to the generic API client signer.
func (r Request) signer() string {
	if strings.HasPrefix(r.User, nodeUserPrefix) && slices.Equal(r.Groups, []string{nodesGroup}) {
		return certificatesv1.KubeAPIServerClientKubeletSignerName
	}
	return certificatesv1.KubeAPIServerClientSignerName
}

func (r Request) validate() error {
	if r.User == "" {
		return errors.New("a user name is required")
	}
	if strings.HasPrefix(r.User, nodeUserPrefix) {
		if len(r.User) == len(nodeUserPrefix) {
			return fmt.Errorf("user %q: names no node", r.User)
		}
		if !slices.Equal(r.Groups, []string{nodesGroup}) {
			return fmt.Errorf("user %q: a node's identity has exactly the group %s (got %v)", r.User, nodesGroup, r.Groups)
		}
	}
	if slices.Contains(r.Groups, "system:masters") {
		return errors.New("group system:masters: the API client signer refuses it; use the admin kubeconfig instead")
	}
	return nil
}

// Issued is a client certificate and its private key, PEM-encoded.
type Issued struct {
	Name          string // the CertificateSigningRequest
	Cert, Key     []byte
	SignerName    string
	RequestedUser string
}

// Issue creates a key and a CertificateSigningRequest for r, approves it as the client's
// user (who needs the approve verb on the signer, as a cluster admin has), and waits until
// the signer issues the certificate or ctx ends. A request the signer fails or someone
// denies is an error with its reason.
func Issue(ctx context.Context, client kubernetes.Interface, r Request) (*Issued, error) {
	if err := r.validate(); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating key: %w", err)
	}
	der, err := certutil.MakeCSR(key, &pkix.Name{CommonName: r.User, Organization: r.Groups}, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("making certificate request: %w", err)
	}
	var duration *time.Duration
	if r.Duration > 0 {
		duration = &r.Duration
	}
	// The name is generated: a second Issue for the same user is a new key and request,
	// never one that picks up another caller's certificate.
	name, uid, err := csr.RequestCertificateWithContext(ctx, client, der, "", r.signer(), duration,
		[]certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}, key)
	if err != nil {
		return nil, fmt.Errorf("creating certificate signing request for %s: %w", r.User, err)
	}
	req, err := client.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading certificate signing request %s: %w", name, err)
	}
	req.Status.Conditions = append(req.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type:    certificatesv1.CertificateApproved,
		Status:  "True",
		Reason:  "CrdipcKubeconfig",
		Message: "approved by crdipc kubeconfig for " + r.User,
	})
	if _, err := client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, name, req, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("approving certificate signing request %s: %w", name, err)
	}
	cert, err := csr.WaitForCertificate(ctx, client, name, uid)
	if err != nil {
		return nil, fmt.Errorf("waiting for the certificate of request %s (is kube-controller-manager's CSR signer running?): %w", name, err)
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return nil, fmt.Errorf("encoding key: %w", err)
	}
	return &Issued{Name: name, Cert: cert, Key: keyPEM, SignerName: r.signer(), RequestedUser: r.User}, nil
}

// Kubeconfig is a kubeconfig for the issued identity on the cluster of base: its server
// (or server when set) and its CA, with the certificate and key embedded, so the file
// stands alone on the node it is copied to.
func Kubeconfig(base *rest.Config, server string, issued *Issued) ([]byte, error) {
	if server == "" {
		server = base.Host
	}
	ca := base.CAData
	if len(ca) == 0 && base.CAFile != "" {
		var err error
		if ca, err = os.ReadFile(base.CAFile); err != nil {
			return nil, fmt.Errorf("reading the cluster's CA: %w", err)
		}
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["crdipc"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca, InsecureSkipTLSVerify: base.Insecure}
	cfg.AuthInfos[issued.RequestedUser] = &clientcmdapi.AuthInfo{ClientCertificateData: issued.Cert, ClientKeyData: issued.Key}
	cfg.Contexts["crdipc"] = &clientcmdapi.Context{Cluster: "crdipc", AuthInfo: issued.RequestedUser}
	cfg.CurrentContext = "crdipc"
	return clientcmd.Write(*cfg)
}
