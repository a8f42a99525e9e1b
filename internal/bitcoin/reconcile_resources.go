package bitcoin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bitcoinv1alpha1 "github.com/crdipc/crdipc/api/bitcoin/v1alpha1"
	"github.com/crdipc/crdipc/ipc"
)

// Labels on everything the operator makes for a network.
const (
	// NetworkLabel names the BitcoinNetwork a pod, Service, StatefulSet or Secret belongs to.
	NetworkLabel = "bitcoin.crdipc.io/network"
	// FieldOwner is the operator's server-side apply field manager.
	FieldOwner = "crdipc-bitcoin-operator"
)

// Secret keys of the RPC credentials, as spec.secretName documents them.
const (
	SecretUser     = "user"
	SecretPassword = "password"
)

// Ports are a node's P2P and RPC ports.
type Ports struct{ P2P, RPC int32 }

// PortsOf returns the default ports of an implementation on a chain, so the nodes need no
// flags to agree. P2P is the chain's; RPC is bitcoind's 8332/18332/18443, while btcd
// serves RPC on 8334 on mainnet and 18334 on testnet and regtest.
func PortsOf(impl bitcoinv1alpha1.Implementation, n bitcoinv1alpha1.Network) Ports {
	var p Ports
	switch n {
	case bitcoinv1alpha1.NetworkTestnet:
		p = Ports{P2P: 18333, RPC: 18332}
	case bitcoinv1alpha1.NetworkMainnet:
		p = Ports{P2P: 8333, RPC: 8332}
	default:
		p = Ports{P2P: 18444, RPC: 18443}
	}
	if impl == bitcoinv1alpha1.ImplementationBtcd {
		p.RPC = 18334
		if n == bitcoinv1alpha1.NetworkMainnet {
			p.RPC = 8334
		}
	}
	return p
}

// SecretName is the Secret holding the network's RPC credentials.
func SecretName(n *bitcoinv1alpha1.BitcoinNetwork) string {
	if n.Spec.SecretName != "" {
		return n.Spec.SecretName
	}
	return n.Name + "-rpc"
}

// implementation is the network's node program; the API server defaults it, but an object
// from an older operator's cache or a test may lack it.
func implementation(n *bitcoinv1alpha1.BitcoinNetwork) bitcoinv1alpha1.Implementation {
	if n.Spec.Implementation == "" {
		return bitcoinv1alpha1.ImplementationBitcoind
	}
	return n.Spec.Implementation
}

func selectorLabels(n *bitcoinv1alpha1.BitcoinNetwork) map[string]string {
	return map[string]string{NetworkLabel: n.Name, "app.kubernetes.io/name": "bitcoind", "app.kubernetes.io/instance": n.Name}
}

func ownerRef(n *bitcoinv1alpha1.BitcoinNetwork) *metav1ac.OwnerReferenceApplyConfiguration {
	return metav1ac.OwnerReference().
		WithAPIVersion(bitcoinv1alpha1.GroupVersion.String()).WithKind("BitcoinNetwork").
		WithName(n.Name).WithUID(n.UID).WithController(true).WithBlockOwnerDeletion(true)
}

// credentials returns the RPC user and password, generating the Secret on first use. A
// generated Secret is created once and never rewritten: the running nodes hold its password.
func (h *handler) credentials(ctx context.Context, n *bitcoinv1alpha1.BitcoinNetwork) (user, pass string, err error) {
	var s corev1.Secret
	key := client.ObjectKey{Namespace: n.Namespace, Name: SecretName(n)}
	// Read from the API server, not a cache: caching Secrets would mean watching every
	// Secret of the cluster, and the RBAC to do so.
	err = h.live.Get(ctx, key, &s)
	if apierrors.IsNotFound(err) && n.Spec.SecretName == "" {
		buf := make([]byte, 24)
		if _, err := rand.Read(buf); err != nil {
			return "", "", fmt.Errorf("generating the rpc password: %w", err)
		}
		s = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: n.Namespace, Name: key.Name, Labels: selectorLabels(n),
				OwnerReferences: []metav1.OwnerReference{{APIVersion: bitcoinv1alpha1.GroupVersion.String(), Kind: "BitcoinNetwork",
					Name: n.Name, UID: n.UID, Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}},
			StringData: map[string]string{SecretUser: "crdipc", SecretPassword: hex.EncodeToString(buf)},
		}
		if err = h.c.Create(ctx, &s); apierrors.IsAlreadyExists(err) {
			err = h.live.Get(ctx, key, &s) // made a moment ago, by an earlier reconcile
		}
	}
	if apierrors.IsNotFound(err) {
		return "", "", errWaiting(fmt.Sprintf("secret %s (spec.secretName) does not exist", key.Name))
	}
	if err != nil {
		return "", "", fmt.Errorf("reading secret %s: %w", key.Name, err)
	}
	user, pass = string(s.Data[SecretUser]), string(s.Data[SecretPassword])
	if user == "" || pass == "" {
		return "", "", errWaiting(fmt.Sprintf("secret %s needs non-empty keys %q and %q", key.Name, SecretUser, SecretPassword))
	}
	return user, pass, nil
}

// applyService keeps the headless Service that gives each node pod a stable DNS name,
// <pod>.<network>.<namespace>.svc.
func (h *handler) applyService(ctx context.Context, n *bitcoinv1alpha1.BitcoinNetwork) error {
	p := PortsOf(implementation(n), n.Spec.Network)
	svc := corev1ac.Service(n.Name, n.Namespace).
		WithLabels(selectorLabels(n)).WithOwnerReferences(ownerRef(n)).
		WithSpec(corev1ac.ServiceSpec().
			WithClusterIP(corev1.ClusterIPNone).
			WithSelector(selectorLabels(n)).
			// Peers must find each other before they are ready: readiness is about RPC.
			WithPublishNotReadyAddresses(true).
			WithPorts(
				corev1ac.ServicePort().WithName("p2p").WithPort(p.P2P).WithTargetPort(intstr.FromString("p2p")),
				corev1ac.ServicePort().WithName("rpc").WithPort(p.RPC).WithTargetPort(intstr.FromString("rpc")),
			))
	if err := h.c.Apply(ctx, svc, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying service %s: %w", n.Name, err)
	}
	return nil
}

// Args are the node's command line for a network; RPC credentials come from the
// environment, so they are not visible in the pod spec.
func Args(impl bitcoinv1alpha1.Implementation, network bitcoinv1alpha1.Network) []string {
	p := PortsOf(impl, network)
	if impl == bitcoinv1alpha1.ImplementationBtcd {
		// btcd keeps its chain, logs and RPC key pair in $HOME/.btcd (HOME is the data
		// volume). It serves RPC over TLS with a certificate it makes on first start:
		// --notls is refused off loopback, and the operator dials the pod IP.
		args := []string{
			fmt.Sprintf("--listen=:%d", p.P2P), fmt.Sprintf("--rpclisten=:%d", p.RPC),
			"--rpcuser=$(RPC_USER)", "--rpcpass=$(RPC_PASSWORD)",
		}
		switch network {
		case bitcoinv1alpha1.NetworkTestnet:
			args = append([]string{"--testnet"}, args...)
		case bitcoinv1alpha1.NetworkMainnet:
		default:
			args = append([]string{"--regtest"}, args...)
		}
		return args
	}
	args := []string{
		"-server=1", "-listen=1", "-printtoconsole=1",
		fmt.Sprintf("-port=%d", p.P2P), fmt.Sprintf("-rpcport=%d", p.RPC),
		"-rpcbind=0.0.0.0", "-rpcallowip=0.0.0.0/0",
		"-rpcuser=$(RPC_USER)", "-rpcpassword=$(RPC_PASSWORD)",
		"-datadir=/data",
	}
	switch network {
	case bitcoinv1alpha1.NetworkTestnet:
		args = append([]string{"-testnet=1"}, args...)
	case bitcoinv1alpha1.NetworkMainnet:
	default:
		args = append([]string{"-regtest=1"}, args...)
	}
	return args
}

// applyStatefulSet keeps the StatefulSet of spec.nodes node pods.
func (h *handler) applyStatefulSet(ctx context.Context, n *bitcoinv1alpha1.BitcoinNetwork) error {
	if err := h.c.Apply(ctx, statefulSet(n), client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("applying statefulset %s: %w", n.Name, err)
	}
	return nil
}

// statefulSet is the network's StatefulSet. Pods start in parallel: a node needs no other
// to start, the operator connects them once they are up.
func statefulSet(n *bitcoinv1alpha1.BitcoinNetwork) *appsv1ac.StatefulSetApplyConfiguration {
	impl := implementation(n)
	p := PortsOf(impl, n.Spec.Network)
	secretEnv := func(name, key string) *corev1ac.EnvVarApplyConfiguration {
		return corev1ac.EnvVar().WithName(name).WithValueFrom(corev1ac.EnvVarSource().
			WithSecretKeyRef(corev1ac.SecretKeySelector().WithName(SecretName(n)).WithKey(key)))
	}
	env := []*corev1ac.EnvVarApplyConfiguration{secretEnv("RPC_USER", SecretUser), secretEnv("RPC_PASSWORD", SecretPassword)}
	if impl == bitcoinv1alpha1.ImplementationBtcd {
		// btcd creates $HOME/.btcd before it reads a flag, and the image's user has no home
		// directory of its own.
		env = append(env, corev1ac.EnvVar().WithName("HOME").WithValue("/data"))
	}
	container := corev1ac.Container().
		WithName(string(impl)).WithImage(n.Spec.ImageOrDefault()).
		// Never pulled when the node has it: the btcd image is imported into nodes, not
		// published to a registry.
		WithImagePullPolicy(corev1.PullIfNotPresent).
		WithCommand(string(impl)).WithArgs(Args(impl, n.Spec.Network)...).
		WithEnv(env...).
		WithPorts(
			corev1ac.ContainerPort().WithName("p2p").WithContainerPort(p.P2P),
			corev1ac.ContainerPort().WithName("rpc").WithContainerPort(p.RPC),
		).
		WithReadinessProbe(corev1ac.Probe().
			WithTCPSocket(corev1ac.TCPSocketAction().WithPort(intstr.FromString("rpc"))).
			WithPeriodSeconds(2).WithFailureThreshold(3)).
		WithVolumeMounts(corev1ac.VolumeMount().WithName("data").WithMountPath("/data")).
		WithSecurityContext(corev1ac.SecurityContext().WithAllowPrivilegeEscalation(false).WithRunAsNonRoot(true).WithRunAsUser(1000))
	pod := corev1ac.PodSpec().WithContainers(container).
		// A test network is worth more spread over machines: one node lost takes one peer.
		// Preferred, not required: a one-machine cluster still runs every node.
		WithTopologySpreadConstraints(corev1ac.TopologySpreadConstraint().
			WithMaxSkew(1).WithTopologyKey(corev1.LabelHostname).
			WithWhenUnsatisfiable(corev1.ScheduleAnyway).
			WithLabelSelector(metav1ac.LabelSelector().WithMatchLabels(selectorLabels(n))))
	spec := appsv1ac.StatefulSetSpec().
		WithReplicas(n.Spec.Nodes).
		WithServiceName(n.Name).
		WithPodManagementPolicy("Parallel").
		WithSelector(metav1ac.LabelSelector().WithMatchLabels(selectorLabels(n)))
	if s := n.Spec.Storage; s != nil {
		// One claim per node, made by the StatefulSet controller and kept when the pod is
		// deleted: the chain survives restarts and moves with the pod.
		claim := corev1ac.PersistentVolumeClaimSpec().
			WithAccessModes(corev1.ReadWriteOnce).
			WithResources(corev1ac.VolumeResourceRequirements().WithRequests(corev1.ResourceList{corev1.ResourceStorage: s.Size}))
		if s.StorageClassName != nil {
			claim.WithStorageClassName(*s.StorageClassName)
		}
		spec.WithVolumeClaimTemplates(corev1ac.PersistentVolumeClaim("data", "").WithSpec(claim))
	} else {
		// The chain of a test network is disposable unless spec.storage asks otherwise.
		pod.WithVolumes(corev1ac.Volume().WithName("data").WithEmptyDir(corev1ac.EmptyDirVolumeSource()))
	}
	// The network's trace goes on the StatefulSet, not on its pod template: a template
	// that changed with every trace would roll the pods each time.
	return appsv1ac.StatefulSet(n.Name, n.Namespace).
		WithLabels(selectorLabels(n)).WithOwnerReferences(ownerRef(n)).
		WithAnnotations(ipc.TraceContextAnnotations(n)).
		WithSpec(spec.WithTemplate(corev1ac.PodTemplateSpec().WithLabels(selectorLabels(n)).WithSpec(pod)))
}
