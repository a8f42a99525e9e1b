package controlplane_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crdipc/crdipc/internal/clientcert"
	"github.com/crdipc/crdipc/internal/testenv"
)

// readyNode creates a Ready Node with a kubelet's capacity, labelled for the test, and
// removes it after.
func readyNode(t *testing.T, c client.Client, name string, labels map[string]string) *corev1.Node {
	t.Helper()
	ctx := context.Background()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if err := c.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), n) })
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("2"),
		corev1.ResourceMemory: resource.MustParse("4Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	n.Status.Capacity, n.Status.Allocatable = res, res
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Test", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if err := c.Status().Update(ctx, n); err != nil {
		t.Fatal(err)
	}
	testenv.LiftNotReadyTaint(t, c, name)
	return n
}

// TestSchedulerBindsPods: kube-scheduler runs in the control plane and binds a pod that
// names no node to the one node its selector matches, and leaves a pod that fits no node
// Pending with kube-scheduler's reason.
func TestSchedulerBindsPods(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	label := map[string]string{"controlplane.test/scheduler": ns}
	readyNode(t, env.Client, "sched-"+ns, label)
	pod := func(name string, selector map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PodSpec{
				NodeSelector:                 selector,
				AutomountServiceAccountToken: new(bool),
				Containers:                   []corev1.Container{{Name: "c", Image: "busybox"}},
			},
		}
	}
	if err := env.Client.Create(ctx, pod("fits", label)); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, pod("fits-nowhere", map[string]string{"controlplane.test/none": ns})); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "the pod bound to the node its selector matches", func(ctx context.Context) (bool, error) {
		var p corev1.Pod
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fits"}, &p); err != nil {
			return false, err
		}
		if p.Spec.NodeName != "sched-"+ns {
			return false, fmt.Errorf("bound to %q", p.Spec.NodeName)
		}
		return true, nil
	})
	testenv.Eventually(t, 30*time.Second, "the pod that fits nowhere Unschedulable", func(ctx context.Context) (bool, error) {
		var p corev1.Pod
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fits-nowhere"}, &p); err != nil {
			return false, err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				if !strings.Contains(c.Message, "didn't match Pod's node affinity/selector") {
					return false, fmt.Errorf("unschedulable for another reason: %s", c.Message)
				}
				return p.Spec.NodeName == "", nil
			}
		}
		return false, fmt.Errorf("conditions %v", p.Status.Conditions)
	})
}

// TestNodeCredentials: a node's kubeconfig issued through a CertificateSigningRequest
// authenticates as system:node:<name> in system:nodes, and the Node authorizer with
// NodeRestriction confines it to its own Node.
func TestNodeCredentials(t *testing.T) {
	env := testenv.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := env.Namespace(t)
	own, other := "cred-"+ns, "cred-other-"+ns
	readyNode(t, env.Client, other, nil)

	issued, err := clientcert.Issue(ctx, env.Kube, clientcert.NodeRequest(own))
	if err != nil {
		t.Fatal(err)
	}
	data, err := clientcert.Kubeconfig(env.Config, "", issued)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		t.Fatal(err)
	}
	node, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// A kubelet registers its own Node and may neither read another's ...
	actsAsNode(t, env, node, own, other)
	// ... nor write it.
	o, err := env.Kube.CoreV1().Nodes().Get(ctx, other, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	o.Labels = map[string]string{"stolen": "true"}
	if _, err := node.CoreV1().Nodes().Update(ctx, o, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("node %s updating node %s: got %v, want Forbidden", own, other, err)
	}
	// Its own, it may.
	mine, err := node.CoreV1().Nodes().Get(ctx, own, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mine.Labels = map[string]string{"mine": "true"}
	if _, err := node.CoreV1().Nodes().Update(ctx, mine, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node %s updating itself: %v", own, err)
	}

	// The request is an object, approved, with the certificate in its status.
	csr, err := env.Kube.CertificatesV1().CertificateSigningRequests().Get(ctx, issued.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if csr.Spec.SignerName != "kubernetes.io/kube-apiserver-client-kubelet" || len(csr.Status.Certificate) == 0 {
		t.Fatalf("request %s: signer %s, certificate %d bytes", csr.Name, csr.Spec.SignerName, len(csr.Status.Certificate))
	}
}

// TestNodeConfig: the node credentials the control plane issues itself, from its CA (what
// `crdipc up` gives each simulated node), authenticate as system:node:<name> in
// system:nodes, so the Node authorizer and NodeRestriction confine them to their own Node.
func TestNodeConfig(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	own, other := "issued-"+ns, "issued-other-"+ns
	readyNode(t, env.Client, other, nil)
	node, err := kubernetes.NewForConfig(env.AsNode(t, own))
	if err != nil {
		t.Fatal(err)
	}
	actsAsNode(t, env, node, own, other)
	if _, err := node.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "impostor-" + ns}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("node %s registering another node: got %v, want Forbidden", own, err)
	}
}

// actsAsNode checks that node authenticates as system:node:<own> in system:nodes, may
// register its own Node and may not read node other.
func actsAsNode(t *testing.T, env *testenv.Env, node kubernetes.Interface, own, other string) {
	t.Helper()
	ctx := context.Background()
	review, err := node.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := review.Status.UserInfo; u.Username != "system:node:"+own || !slices.Contains(u.Groups, "system:nodes") {
		t.Fatalf("the node's credentials authenticate as %q %v", u.Username, u.Groups)
	}
	if _, err := node.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: own}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the node registering itself: %v", err)
	}
	t.Cleanup(func() { _ = env.Kube.CoreV1().Nodes().Delete(context.Background(), own, metav1.DeleteOptions{}) })
	if _, err := node.CoreV1().Nodes().Get(ctx, other, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("node %s reading node %s: got %v, want Forbidden", own, other, err)
	}
}

func TestNodeCredentialsRefused(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	for _, r := range []clientcert.Request{
		{},
		{User: "system:node:"},
		{User: "system:node:x", Groups: []string{"system:masters"}},
		{User: "someone", Groups: []string{"system:masters"}},
	} {
		if _, err := clientcert.Issue(ctx, env.Kube, r); err == nil {
			t.Errorf("Issue(%+v): no error", r)
		}
	}
}

// TestKubeletClientMayUseKubelets: the API server's kubelet client, which kubelets that
// authorize by webhook ask about, may use every kubelet API (logs, exec: nodes/proxy).
func TestKubeletClientMayUseKubelets(t *testing.T) {
	env := testenv.Get(t)
	for _, sub := range []string{"proxy", "log", "stats", "metrics"} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "kube-apiserver-kubelet-client",
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Resource: "nodes", Subresource: sub, Name: "any"},
		}}
		res, err := env.Kube.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), sar, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Status.Allowed {
			t.Errorf("kube-apiserver-kubelet-client get nodes/%s: denied (%s)", sub, res.Status.Reason)
		}
	}
}
