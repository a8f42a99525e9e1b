package operator

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	storagev1alpha1 "github.com/crdipc/crdipc/api/storage/v1alpha1"
	"github.com/crdipc/crdipc/internal/identity"
	"github.com/crdipc/crdipc/internal/install"
	"github.com/crdipc/crdipc/internal/storage/dataca"
)

// The operator approves the data-path identities nodes request for themselves and signs
// every approved request for its signer (package dataca).
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval;certificatesigningrequests/status,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,verbs=approve;sign,resourceNames=crdipc.io/storage-data
// The pod a requester's token is bound to may name its own pod IPs (addressOf).
// +kubebuilder:rbac:groups="",resources=pods,verbs=get,namespace=crdipc-system

// User extras the API server sets from a token bound to a Pod or a Node: the node it was
// issued for, and the pod.
const (
	NodeNameExtra = "authentication.kubernetes.io/node-name"
	PodNameExtra  = "authentication.kubernetes.io/pod-name"
	PodUIDExtra   = "authentication.kubernetes.io/pod-uid"
)

// Condition reasons the operator writes on the requests it judges.
const (
	reasonApproved = "NodeRequestsItsOwnIdentity"
	reasonDenied   = "NotTheRequestersIdentity"
)

// csrHandler approves or denies the requests for DataSigner that node-side requesters make,
// and signs approved ones. A request from anyone else (an administrator, a tool) is left to
// another approver: approval is the API's authorization gate, and whoever may approve for
// this signer decides; the operator signs what is approved.
type csrHandler struct {
	c    client.Client // cached CertificateSigningRequests and Nodes
	live client.Reader // the CA Secret, read from the API server
	log  logr.Logger
}

func addCSRController(mgr manager.Manager) error {
	h := &csrHandler{c: mgr.GetClient(), live: mgr.GetAPIReader(), log: mgr.GetLogger().WithName("storage-data-csr")}
	ours := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.(*certificatesv1.CertificateSigningRequest).Spec.SignerName == storagev1alpha1.DataSigner
	})
	return builder.ControllerManagedBy(mgr).Named("storage-data-csr").
		For(&certificatesv1.CertificateSigningRequest{}, builder.WithPredicates(ours)).
		Complete(h)
}

// Reconcile implements reconcile.Reconciler. Every step is a single write that moves the
// request on, so a repeated or concurrent reconcile conflicts or finds it done.
func (h *csrHandler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var csr certificatesv1.CertificateSigningRequest
	if err := h.c.Get(ctx, req.NamespacedName, &csr); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if csr.Spec.SignerName != storagev1alpha1.DataSigner || len(csr.Status.Certificate) > 0 ||
		hasCondition(&csr, certificatesv1.CertificateDenied) || hasCondition(&csr, certificatesv1.CertificateFailed) {
		return reconcile.Result{}, nil
	}
	log := h.log.WithValues("request", csr.Name, "requester", csr.Spec.Username)
	if !hasCondition(&csr, certificatesv1.CertificateApproved) {
		decided, deny, err := h.judge(ctx, &csr)
		if err != nil || !decided {
			return reconcile.Result{}, err
		}
		c := certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: reasonApproved, LastUpdateTime: metav1.Now(),
			Message: "the requester is the node its identity names",
		}
		if deny != "" {
			c.Type, c.Reason, c.Message = certificatesv1.CertificateDenied, reasonDenied, deny
		}
		csr.Status.Conditions = append(csr.Status.Conditions, c)
		if err := h.c.SubResource("approval").Update(ctx, &csr); err != nil {
			return reconcile.Result{}, fmt.Errorf("%s certificate signing request %s: %w", strings.ToLower(string(c.Type)), csr.Name, err)
		}
		if deny != "" {
			log.Info("denied a data-path certificate request", "why", deny)
			return reconcile.Result{}, nil
		}
		log.Info("approved a data-path certificate request")
	}
	return reconcile.Result{}, h.sign(ctx, &csr, log)
}

// sign signs an approved request; one the signer cannot sign is marked Failed.
func (h *csrHandler) sign(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, log logr.Logger) error {
	ca, err := dataca.Load(ctx, h.live, install.SystemNamespace)
	if err != nil {
		return err // the CA keeper creates it; retried with backoff
	}
	crt, err := dataca.Sign(ca, csr.Spec, time.Now())
	if err != nil {
		log.Info("cannot sign an approved data-path certificate request", "why", err.Error())
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateFailed, Status: corev1.ConditionTrue, Reason: "SignerValidationFailure",
			Message: err.Error(), LastUpdateTime: metav1.Now(),
		})
	} else {
		csr.Status.Certificate = crt
	}
	if err := h.c.Status().Update(ctx, csr); err != nil {
		return fmt.Errorf("writing the certificate of request %s: %w", csr.Name, err)
	}
	return nil
}

// judge decides a request: decided is false when the requester is not a node-side identity
// (someone else approves or denies it); deny is why it is denied, empty when approved.
func (h *csrHandler) judge(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (decided bool, deny string, err error) {
	if decided, deny := judgeController(csr.Spec); decided {
		return true, deny, nil
	}
	node, roles, deny, ours := requester(csr.Spec)
	if !ours {
		return false, "", nil
	}
	if deny != "" {
		return true, deny, nil
	}
	c, err := dataca.CheckRequest(csr.Spec)
	if err != nil {
		return true, err.Error(), nil
	}
	if c.Node != node {
		return true, fmt.Sprintf("%s is node %s, the request names node %s: a node may request only its own identity", csr.Spec.Username, node, c.Node), nil
	}
	if !slices.Contains(roles, c.Role) {
		return true, fmt.Sprintf("%s may request a %v identity of its node, not a %s one", csr.Spec.Username, roles, c.Role), nil
	}
	var n corev1.Node
	if err := h.c.Get(ctx, client.ObjectKey{Name: node}, &n); apierrors.IsNotFound(err) {
		return true, fmt.Sprintf("node %s does not exist", node), nil
	} else if err != nil {
		return false, "", fmt.Errorf("reading node %s: %w", node, err)
	}
	pod, err := h.requesterPod(ctx, csr.Spec, node)
	if err != nil {
		return false, "", err
	}
	for _, ip := range c.Request.IPAddresses {
		if why := addressOf(&n, pod, ip); why != "" {
			return true, why, nil
		}
	}
	return true, "", nil
}

// requesterPod is the running Pod on node that the requester's token is bound to, or nil:
// a pool agent that is not on the host network serves on its pod IP.
func (h *csrHandler) requesterPod(ctx context.Context, spec certificatesv1.CertificateSigningRequestSpec, node string) (*corev1.Pod, error) {
	name, uid := spec.Extra[PodNameExtra], spec.Extra[PodUIDExtra]
	ns, _, ok := strings.Cut(strings.TrimPrefix(spec.Username, "system:serviceaccount:"), ":")
	if len(name) != 1 || len(uid) != 1 || !ok || !strings.HasPrefix(spec.Username, "system:serviceaccount:") {
		return nil, nil
	}
	var pod corev1.Pod
	if err := h.live.Get(ctx, client.ObjectKey{Namespace: ns, Name: name[0]}, &pod); apierrors.IsNotFound(err) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("reading the requester's pod %s/%s: %w", ns, name[0], err)
	}
	if string(pod.UID) != uid[0] || pod.Spec.NodeName != node {
		return nil, nil
	}
	return &pod, nil
}

// judgeController decides the requests for the CSI controller's identity, and the CSI
// driver's ServiceAccount's requests, which are for it unless bound to a node (the driver's
// node plugin outside up): the controller is no node's, and no node may be it.
func judgeController(spec certificatesv1.CertificateSigningRequestSpec) (decided bool, deny string) {
	driver := spec.Username == identity.Username(install.SystemNamespace, "csi-driver")
	c, err := dataca.CheckRequest(spec)
	switch {
	case err == nil && c.Role == dataca.RoleController && driver:
		return true, ""
	case err == nil && c.Role == dataca.RoleController:
		if _, _, _, ours := requester(spec); ours {
			return true, fmt.Sprintf("%s may not request the CSI controller's identity: only %s may", spec.Username, identity.Username(install.SystemNamespace, "csi-driver"))
		}
	}
	return false, ""
}

// requester names the node whose identities the requester of spec may have, and which.
// ours is false for requesters that are not node-side; deny is set for a node-side
// ServiceAccount whose token is not bound to one node.
func requester(spec certificatesv1.CertificateSigningRequestSpec) (node string, roles []dataca.Role, deny string, ours bool) {
	if n, ok := strings.CutPrefix(spec.Username, "system:node:"); ok && slices.Contains(spec.Groups, "system:nodes") {
		// The kubelet is the node: it may be any part of it.
		return n, []dataca.Role{dataca.RoleNode, dataca.RoleCSINode}, "", true
	}
	switch spec.Username {
	case identity.Username(install.SystemNamespace, "pool-agent"):
		roles = []dataca.Role{dataca.RoleNode}
	case identity.Username(install.SystemNamespace, "csi-node"), identity.Username(install.SystemNamespace, "csi-driver"):
		// The driver's node plugin runs as the csi-driver ServiceAccount outside up.
		roles = []dataca.Role{dataca.RoleCSINode}
	default:
		return "", nil, "", false
	}
	bound := spec.Extra[NodeNameExtra]
	if len(bound) != 1 || bound[0] == "" {
		return "", nil, fmt.Sprintf("the token of %s is not bound to a node (no user extra %s): only a token bound to its node, a pod's or a node's, may request a node's identity", spec.Username, NodeNameExtra), true
	}
	return bound[0], roles, "", true
}

// addressOf says why ip may not be in node's certificate, or "" if it may: it must be one of
// the addresses the Node reports, or of the requester's own pod on the node (pod, if any).
// A Node that reports none is one of crdipc up's simulated nodes (or a test's), whose agents
// all listen on this machine's loopback: such a node may name loopback addresses, which no
// other machine can dial anyway.
func addressOf(n *corev1.Node, pod *corev1.Pod, ip net.IP) string {
	if pod != nil {
		for _, a := range pod.Status.PodIPs {
			if ip.Equal(net.ParseIP(a.IP)) {
				return ""
			}
		}
	}
	if len(n.Status.Addresses) == 0 {
		if ip.IsLoopback() {
			return ""
		}
		return fmt.Sprintf("node %s reports no addresses, so its certificate may name loopback addresses only, not %s", n.Name, ip)
	}
	for _, a := range n.Status.Addresses {
		if ip.Equal(net.ParseIP(a.Address)) {
			return ""
		}
	}
	return fmt.Sprintf("%s is not an address of node %s, nor of the requester's pod", ip, n.Name)
}

func hasCondition(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
