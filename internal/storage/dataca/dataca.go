package dataca

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/storage/replica"
)

// ErrNotCreated is returned (wrapped) by Load while the operator has not created the CA.
var ErrNotCreated = errors.New("the storage data CA does not exist yet")

// Ensure returns the CA from the Secret in namespace, creating it with w first if it does
// not exist. Two callers racing create one Secret: the loser reads the winner's. r should
// read from the API server (a manager's APIReader): a cached read would make the caller
// watch every Secret of the cluster.
func Ensure(ctx context.Context, r client.Reader, w client.Writer, namespace string) (replica.CA, error) {
	ca, err := Load(ctx, r, namespace)
	if !errors.Is(err, ErrNotCreated) {
		return ca, err
	}
	if ca, err = replica.NewCA(); err != nil {
		return replica.CA{}, err
	}
	crt, key, err := ca.EncodePEM()
	if err != nil {
		return replica.CA{}, err
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: storagev1alpha1.DataCASecret},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key},
	}
	err = w.Create(ctx, s)
	if apierrors.IsAlreadyExists(err) {
		return Load(ctx, r, namespace)
	}
	if err != nil {
		return replica.CA{}, fmt.Errorf("creating secret %s/%s: %w", namespace, storagev1alpha1.DataCASecret, err)
	}
	return ca, nil
}

// Load reads the CA from its Secret in namespace; ErrNotCreated if there is none yet.
func Load(ctx context.Context, r client.Reader, namespace string) (replica.CA, error) {
	var s corev1.Secret
	err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: storagev1alpha1.DataCASecret}, &s)
	if apierrors.IsNotFound(err) {
		return replica.CA{}, fmt.Errorf("secret %s/%s: %w", namespace, storagev1alpha1.DataCASecret, ErrNotCreated)
	}
	if err != nil {
		return replica.CA{}, fmt.Errorf("reading secret %s/%s: %w", namespace, storagev1alpha1.DataCASecret, err)
	}
	ca, err := replica.ParseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return replica.CA{}, fmt.Errorf("secret %s/%s: %w", namespace, storagev1alpha1.DataCASecret, err)
	}
	return ca, nil
}

// Identity issues a certificate from ca for name, valid for the IPs and host names of
// addr (a listen or advertised address; empty for a part that only dials), and returns
// the server and client TLS configurations that use it.
func Identity(ca replica.CA, name string, hosts ...string) (server, client *tls.Config, err error) {
	var ips []net.IP
	var dns []string
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
		} else if h != "" {
			dns = append(dns, h)
		}
	}
	cert, err := ca.Issue(name, ips, dns)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing the data-path certificate of %s: %w", name, err)
	}
	pool := ca.Pool()
	return replica.ServerTLSConfig(pool, cert), replica.ClientTLSConfig(pool, cert), nil
}
