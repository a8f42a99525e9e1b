package dataca

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/client-go/util/retry"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/replica"
)

// Role is what a data-path identity is for; with the node it names the certificate's common
// name, role:node.
type Role string

const (
	// RoleNode is a node agent: it serves its node's replicas and dials its peers to
	// rebuild, so its certificate is a server and a client one, for its data addresses.
	RoleNode Role = "node"
	// RoleCSINode is a CSI node service: the target of the volumes staged on its node dials
	// their replicas, so its certificate is a client one only.
	RoleCSINode Role = "csi-node"
	// RoleController is the CSI controller: it snapshots volumes staged nowhere and deletes
	// snapshot copies, dialing replicas of any volume. It is no node's, so its common name
	// is the role alone; only the CSI driver's ServiceAccount is approved for it.
	RoleController Role = "csi-controller"
)

// DefaultValidity is the lifetime a data-path certificate is requested for (the request's
// expirationSeconds); the operator grants at most MaxValidity. Obtain renews it at two
// thirds of its lifetime, so an operator may be away for days without breaking the data path.
const DefaultValidity = 7 * 24 * time.Hour

// MaxValidity caps the lifetime of the certificates the operator signs.
const MaxValidity = 30 * 24 * time.Hour

// CommonName is the common name of node's certificate in role (RoleController: no node).
func CommonName(role Role, node string) string {
	if role == RoleController {
		return string(role)
	}
	return string(role) + ":" + node
}

// ParseCommonName is the inverse of CommonName.
func ParseCommonName(cn string) (Role, string, error) {
	if cn == string(RoleController) {
		return RoleController, "", nil
	}
	role, node, ok := strings.Cut(cn, ":")
	if !ok || node == "" || (Role(role) != RoleNode && Role(role) != RoleCSINode) {
		return "", "", fmt.Errorf("common name %q is not node:<node>, csi-node:<node> or csi-controller", cn)
	}
	return Role(role), node, nil
}

// Usages are the key usages of a certificate in role, as requested and as signed.
func Usages(role Role) []certificatesv1.KeyUsage {
	if role == RoleNode {
		return []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth, certificatesv1.UsageClientAuth}
	}
	return []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
}

// Request describes the identity to obtain.
type Request struct {
	Role Role
	// Node is the node the requester runs on, and the only one it may ask an identity for
	// (none for RoleController).
	Node string
	// IPs are the addresses peers dial (RoleNode).
	IPs []net.IP
	// Namespace holds the published CA certificate (DataCAConfigMap).
	Namespace string
	// Validity is the lifetime asked for; default DefaultValidity.
	Validity time.Duration
	// Approve approves the request with the requester's own credentials, for a tool run by
	// someone who may approve for DataSigner (an administrator): the operator judges only
	// node-side requesters, and signs whatever is approved.
	Approve bool
	// Logger; the zero value discards.
	Logger logr.Logger
}

// Identity is a data-path certificate obtained through a CertificateSigningRequest. Its TLS
// configurations present the newest certificate, so a renewal (Run) needs no restart.
type Identity struct {
	kube kubernetes.Interface
	r    Request
	log  logr.Logger
	pool *x509.CertPool
	cert atomic.Pointer[tls.Certificate]
}

// Obtain waits for the published CA certificate, then generates a key (it never leaves this
// process), requests a certificate for it with signer DataSigner and waits until the request
// is approved and signed. A denied request is logged and made again, with backoff: approval
// may come once the node is set up (e.g. reports its address). It returns when ctx ends.
func Obtain(ctx context.Context, kube kubernetes.Interface, r Request) (*Identity, error) {
	if r.Validity <= 0 {
		r.Validity = DefaultValidity
	}
	i := &Identity{kube: kube, r: r, log: r.Logger.WithValues("identity", CommonName(r.Role, r.Node))}
	delay, logged := 100*time.Millisecond, false
	for {
		pool, err := LoadTrust(ctx, kube, r.Namespace)
		if err == nil {
			i.pool = pool
			break
		}
		if !logged || !errors.Is(err, ErrNotCreated) {
			i.log.Info("waiting for the storage data CA", "reason", err.Error())
			logged = true
		}
		if err := sleep(ctx, delay); err != nil {
			return nil, err
		}
		delay = min(2*delay, 5*time.Second)
	}
	if err := i.renew(ctx, time.Second); err != nil {
		return nil, err
	}
	return i, nil
}

// renew obtains a new certificate, retrying from delay on.
func (i *Identity) renew(ctx context.Context, delay time.Duration) error {
	for {
		c, err := i.request(ctx)
		if err == nil {
			i.cert.Store(&c)
			i.log.Info("obtained a data-path certificate", "notAfter", c.Leaf.NotAfter)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		i.log.Error(err, "obtaining a data-path certificate; requesting again", "after", delay)
		if err := sleep(ctx, delay); err != nil {
			return err
		}
		delay = min(2*delay, 5*time.Minute)
	}
}

func (i *Identity) request(ctx context.Context) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generating a key: %w", err)
	}
	cn := CommonName(i.r.Role, i.r.Node)
	der, err := cert.MakeCSR(key, &pkix.Name{CommonName: cn}, nil, i.r.IPs)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("making the certificate request of %s: %w", cn, err)
	}
	// A generated name: every attempt has a key of its own, so no earlier request fits.
	name, uid, err := csr.RequestCertificateWithContext(ctx, i.kube, der, "", storagev1alpha1.DataSigner, &i.r.Validity, Usages(i.r.Role), key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("requesting a certificate for %s: %w", cn, err)
	}
	if i.r.Approve {
		if err := approve(ctx, i.kube, name, cn); err != nil {
			return tls.Certificate{}, err
		}
	} else {
		i.log.Info("waiting for approval of the certificate signing request", "request", name)
	}
	crtPEM, err := csr.WaitForCertificate(ctx, i.kube, name, uid)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certificate signing request %s for %s: %w", name, cn, err)
	}
	certs, err := cert.ParseCertsPEM(crtPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certificate signing request %s: %w", name, err)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: i.pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return tls.Certificate{}, fmt.Errorf("certificate signing request %s: the certificate is not from the published data CA: %w", name, err)
	}
	c := tls.Certificate{PrivateKey: key, Leaf: certs[0]}
	for _, x := range certs {
		c.Certificate = append(c.Certificate, x.Raw)
	}
	return c, nil
}

// Run renews the certificate at two thirds of its lifetime until ctx ends. A renewal that
// fails is retried; the current certificate serves until then.
func (i *Identity) Run(ctx context.Context) {
	for {
		leaf := i.cert.Load().Leaf
		at := leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) * 2 / 3)
		if err := sleep(ctx, time.Until(at)); err != nil {
			return
		}
		if err := i.renew(ctx, time.Second); err != nil {
			return
		}
	}
}

// Certificate is the current certificate.
func (i *Identity) Certificate() *tls.Certificate { return i.cert.Load() }

// Pool holds the published CA certificate, which peers' certificates must chain to.
func (i *Identity) Pool() *x509.CertPool { return i.pool }

// ServerTLS is the configuration of a replica server presenting this identity.
func (i *Identity) ServerTLS() *tls.Config {
	c := replica.ServerTLSConfig(i.pool, tls.Certificate{})
	c.Certificates = nil
	c.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return i.cert.Load(), nil }
	return c
}

// ClientTLS is the configuration for replica.Dial presenting this identity.
func (i *Identity) ClientTLS() *tls.Config {
	c := replica.ClientTLSConfig(i.pool, tls.Certificate{})
	c.Certificates = nil
	c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return i.cert.Load(), nil }
	return c
}

// approve approves request name with the requester's credentials; one approved already
// (ApproveOwn got there first) is left as it is.
func approve(ctx context.Context, kube kubernetes.Interface, name, cn string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		req, err := kube.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		return approveRequest(ctx, kube, req, "approved by its requester for "+cn)
	})
	if err != nil {
		return fmt.Errorf("approving certificate signing request %s: %w", name, err)
	}
	return nil
}

func approveRequest(ctx context.Context, kube kubernetes.Interface, req *certificatesv1.CertificateSigningRequest, msg string) error {
	for _, c := range req.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved || c.Type == certificatesv1.CertificateDenied {
			return nil
		}
	}
	req.Status.Conditions = append(req.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "ApprovedByRequester",
		Message: msg, LastUpdateTime: metav1.Now(),
	})
	_, err := kube.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, req.Name, req, metav1.UpdateOptions{})
	return err
}

// ApproveOwn approves, until ctx ends, the data-path certificate requests made with kube's
// own credentials, for a process whose parts all act as one user that may approve for
// DataSigner (bench, with an administrator's credentials): the operator judges only
// node-side requesters. Requests of anyone else are left alone.
func ApproveOwn(ctx context.Context, kube kubernetes.Interface) error {
	ssr, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("who am i: %w", err)
	}
	me := ssr.Status.UserInfo.Username
	csrs := kube.CertificatesV1().CertificateSigningRequests()
	for ctx.Err() == nil {
		w, err := csrs.Watch(ctx, metav1.ListOptions{})
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return fmt.Errorf("watching certificate signing requests: %w", err)
		}
		for ev := range w.ResultChan() {
			req, ok := ev.Object.(*certificatesv1.CertificateSigningRequest)
			if !ok || req.Spec.SignerName != storagev1alpha1.DataSigner || req.Spec.Username != me {
				continue
			}
			// A conflict means it changed: the change comes as an event of its own.
			if err := approveRequest(ctx, kube, req, "approved by its requester "+me); err != nil && !apierrors.IsConflict(err) && ctx.Err() == nil {
				w.Stop()
				return fmt.Errorf("approving certificate signing request %s: %w", req.Name, err)
			}
		}
		w.Stop()
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
