package operator_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/storage/dataca"
	"github.com/crdipc/crdipc/internal/storage/operator"
	"github.com/crdipc/crdipc/internal/testenv"
)

func kubeFor(t *testing.T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	k, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// A pool agent with a token bound to its node asks for its node's identity: the operator
// approves and signs it, and the certificate verifies against the published CA certificate
// as a server (for the agent's address) and a client.
func TestCSRNodeGetsItsOwnIdentity(t *testing.T) {
	c := newCluster(t)
	c.startOperator()
	node := c.nodeName(1)
	c.addNode(node)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ip := net.ParseIP("127.1.0.9")
	id, err := dataca.Obtain(ctx, kubeFor(t, c.env.AsPoolAgent(t, node)), dataca.Request{
		Role: dataca.RoleNode, Node: node, IPs: []net.IP{ip}, Namespace: install.SystemNamespace,
	})
	if err != nil {
		t.Fatal(err)
	}
	leaf := id.Certificate().Leaf
	if want := "node:" + node; leaf.Subject.CommonName != want {
		t.Errorf("common name %q, want %q", leaf.Subject.CommonName, want)
	}
	// The trust anyone reads from the API, not the one Obtain kept.
	trust, err := dataca.LoadTrust(ctx, kubeFor(t, c.env.Config), install.SystemNamespace)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: trust, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			t.Errorf("verifying for usage %v: %v", u, err)
		}
	}
	if err := leaf.VerifyHostname(ip.String()); err != nil {
		t.Error(err)
	}
	if d := leaf.NotAfter.Sub(leaf.NotBefore); d > dataca.MaxValidity+10*time.Minute {
		t.Errorf("valid for %v, more than %v", d, dataca.MaxValidity)
	}
}

// request makes a certificate request for cn (and ips) with cfg's credentials and returns
// what became of it: the certificate, or the error naming why it was denied.
func request(t *testing.T, cfg *rest.Config, cn string, ips ...net.IP) ([]byte, error) {
	t.Helper()
	kube := kubeFor(t, cfg)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := cert.MakeCSR(key, &pkix.Name{CommonName: cn}, nil, ips)
	if err != nil {
		t.Fatal(err)
	}
	role, _, err := dataca.ParseCommonName(cn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name, uid, err := csr.RequestCertificateWithContext(ctx, kube, der, "", storagev1alpha1.DataSigner, nil, dataca.Usages(role), key)
	if err != nil {
		t.Fatal(err)
	}
	admin := kubeFor(t, testenv.Get(t).Config)
	t.Cleanup(func() {
		_ = admin.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return csr.WaitForCertificate(ctx, kube, name, uid)
}

// Requests that name another node, come from a token bound to no node, or name an address
// the node does not have are denied, with a message that says why.
func TestCSRDenied(t *testing.T) {
	c := newCluster(t)
	c.startOperator()
	a, b := c.nodeName(1), c.nodeName(2)
	c.addNode(a)
	c.addNode(b)
	n := &corev1.Node{}
	if err := c.c.Get(context.Background(), client.ObjectKey{Name: b}, n); err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.9.0.2"}}
	if err := c.c.Status().Update(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	agentA, agentB := c.env.AsPoolAgent(t, a), c.env.AsPoolAgent(t, b)
	unbound := c.env.AsServiceAccount(t, "pool-agent")

	for _, k := range []struct {
		what string
		cfg  *rest.Config
		cn   string
		ips  []net.IP
		want string
	}{
		{"node A's agent asking for node B's identity", agentA, "node:" + b, nil, "is node " + a + ", the request names node " + b},
		{"node A's agent asking for node B's CSI identity", agentA, "csi-node:" + b, nil, "the request names node " + b},
		{"a pool agent token bound to no node", unbound, "node:" + a, nil, "is not bound to a node"},
		{"an address node B does not report", agentB, "node:" + b, []net.IP{net.ParseIP("10.9.0.3")}, "10.9.0.3 is not an address of node " + b},
		{"a loopback address on a node that reports addresses", agentB, "node:" + b, []net.IP{net.ParseIP("127.0.0.1")}, "127.0.0.1 is not an address of node " + b},
		{"a node's agent asking for the CSI controller's identity", agentA, "csi-controller", nil, "may not request the CSI controller's identity"},
	} {
		t.Run(k.what, func(t *testing.T) {
			crt, err := request(t, k.cfg, k.cn, k.ips...)
			if err == nil || !strings.Contains(err.Error(), "denied") || !strings.Contains(err.Error(), k.want) {
				t.Fatalf("got certificate %t, error %v; want denied: %q", crt != nil, err, k.want)
			}
		})
	}
	// The CSI controller, no node's, gets its identity as the CSI driver's ServiceAccount.
	if _, err := request(t, c.env.AsServiceAccount(t, "csi-driver"), "csi-controller"); err != nil {
		t.Errorf("the CSI controller's identity: %v", err)
	}
	// The node's own address is fine.
	if _, err := request(t, agentB, "node:"+b, net.ParseIP("10.9.0.2")); err != nil {
		t.Errorf("node B's own address: %v", err)
	}

	// So is the pod IP of the pool agent's own pod on the node, which its token is bound to
	// (an agent off the host network serves there); another node's pod's is not.
	podOn := func(name, node, ip string) *rest.Config {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: install.SystemNamespace, Name: name},
			Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "crdipc-pool-agent",
				Containers: []corev1.Container{{Name: "agent", Image: "crdipc"}}},
		}
		if err := c.c.Create(context.Background(), pod); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.c.Delete(context.Background(), pod, client.GracePeriodSeconds(0)) })
		pod.Status.PodIP, pod.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
		if err := c.c.Status().Update(context.Background(), pod); err != nil {
			t.Fatal(err)
		}
		cfg := rest.CopyConfig(agentB)
		cfg.Impersonate.Extra = map[string][]string{
			operator.NodeNameExtra: {b}, operator.PodNameExtra: {pod.Name}, operator.PodUIDExtra: {string(pod.UID)},
		}
		return cfg
	}
	if _, err := request(t, podOn(c.id+"-agent-b", b, "10.244.1.5"), "node:"+b, net.ParseIP("10.244.1.5")); err != nil {
		t.Errorf("the agent's own pod IP: %v", err)
	}
	if _, err := request(t, podOn(c.id+"-agent-a", a, "10.244.2.5"), "node:"+b, net.ParseIP("10.244.2.5")); err == nil || !strings.Contains(err.Error(), "not an address of node "+b) {
		t.Errorf("the pod IP of a pod on another node: %v, want denied", err)
	}
}
