package dataca

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/cert"
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

// Publish writes ca's certificate, and nothing else, to the ConfigMap the data-path parts
// trust (DataCAConfigMap in namespace), creating it or putting it back if it differs.
// r should read from the API server, as for Ensure.
func Publish(ctx context.Context, r client.Reader, w client.Writer, namespace string, ca replica.CA) error {
	crt, err := cert.EncodeCertificates(ca.Cert)
	if err != nil {
		return fmt.Errorf("encoding the data CA certificate: %w", err)
	}
	key := client.ObjectKey{Namespace: namespace, Name: storagev1alpha1.DataCAConfigMap}
	var cm corev1.ConfigMap
	err = r.Get(ctx, key, &cm)
	switch {
	case apierrors.IsNotFound(err):
		cm = corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: storagev1alpha1.DataCAConfigMap},
			Data:       map[string]string{storagev1alpha1.DataCAKey: string(crt)},
		}
		if err := w.Create(ctx, &cm); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating configmap %s: %w", key, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading configmap %s: %w", key, err)
	}
	if len(cm.Data) == 1 && cm.Data[storagev1alpha1.DataCAKey] == string(crt) && len(cm.BinaryData) == 0 {
		return nil
	}
	cm.Data, cm.BinaryData = map[string]string{storagev1alpha1.DataCAKey: string(crt)}, nil
	if err := w.Update(ctx, &cm); err != nil {
		return fmt.Errorf("updating configmap %s: %w", key, err)
	}
	return nil
}

// LoadTrust reads the published CA certificate (Publish); ErrNotCreated if there is none yet.
func LoadTrust(ctx context.Context, kube kubernetes.Interface, namespace string) (*x509.CertPool, error) {
	cm, err := kube.CoreV1().ConfigMaps(namespace).Get(ctx, storagev1alpha1.DataCAConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("configmap %s/%s: %w", namespace, storagev1alpha1.DataCAConfigMap, ErrNotCreated)
	}
	if err != nil {
		return nil, fmt.Errorf("reading configmap %s/%s: %w", namespace, storagev1alpha1.DataCAConfigMap, err)
	}
	certs, err := cert.ParseCertsPEM([]byte(cm.Data[storagev1alpha1.DataCAKey]))
	if err != nil {
		return nil, fmt.Errorf("configmap %s/%s: %w", namespace, storagev1alpha1.DataCAConfigMap, err)
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

// Issue issues a certificate from ca for name, valid for the IPs and host names of
// addr (a listen or advertised address; empty for a part that only dials), and returns
// the server and client TLS configurations that use it. Only a holder of the CA key (the
// operator, and tests standing in for it) can; the data-path parts Obtain theirs.
func Issue(ca replica.CA, name string, hosts ...string) (server, client *tls.Config, err error) {
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
