package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Implementation is the Bitcoin node program the network's pods run.
// +kubebuilder:validation:Enum=bitcoind;btcd
type Implementation string

const (
	// ImplementationBitcoind is Bitcoin Core, the reference node; the default, as before
	// the field existed.
	ImplementationBitcoind Implementation = "bitcoind"
	// ImplementationBtcd is btcd, a full node in Go (github.com/btcsuite/btcd). It speaks the
	// same peer-to-peer protocol, but its RPC is TLS-only off loopback and its flags and RPC
	// ports are its own.
	ImplementationBtcd Implementation = "btcd"
)

// The images used when spec.image is left out, by implementation.
const (
	BitcoindImage = "bitcoin/bitcoin:28.0"
	// BtcdImage is the image hack/realnode.sh builds from the btcd module and imports into
	// every real node; no registry publishes an official one.
	BtcdImage = "docker.io/btcsuite/btcd:v0.26.2"
)

// Network is the Bitcoin chain the nodes run on.
// +kubebuilder:validation:Enum=regtest;testnet;mainnet
type Network string

const (
	// NetworkRegtest is a private chain where blocks are mined on demand; the default, since the
	// seed's network is for testing.
	NetworkRegtest Network = "regtest"
	NetworkTestnet Network = "testnet"
	NetworkMainnet Network = "mainnet"
)

// BitcoinStorage asks for a PersistentVolumeClaim of its own for every node's chain.
type BitcoinStorage struct {
	// storageClassName of the claims; unset means the cluster's default class.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	StorageClassName *string `json:"storageClassName,omitempty"`

	// size of each node's claim.
	// +required
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="size must be greater than zero"
	// Less than 8Ei (2^63 bytes): what fits the int64 byte counts of every consumer.
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isLessThan(quantity('8Ei'))",message="size must be less than 8Ei"
	Size resource.Quantity `json:"size"`
}

// BitcoinNetworkSpec describes a small network of Bitcoin nodes that know each other.
// +kubebuilder:validation:XValidation:rule="has(self.storage) == has(oldSelf.storage)",message="storage cannot be added or removed: a StatefulSet's volumeClaimTemplates are fixed"
type BitcoinNetworkSpec struct {
	// nodes is how many Bitcoin nodes to run.
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10
	Nodes int32 `json:"nodes,omitempty"`

	// implementation is the node program: bitcoind (Bitcoin Core) or btcd. Changing it
	// rolls the pods; each keeps its chain in a directory of its own.
	// +optional
	// +kubebuilder:default=bitcoind
	Implementation Implementation `json:"implementation,omitempty"`

	// image is the container image of the implementation. Unset means the implementation's
	// default: bitcoin/bitcoin:28.0 for bitcoind, docker.io/btcsuite/btcd:v0.26.2 for btcd
	// (a CRD default cannot depend on another field, so the operator picks it).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image,omitempty"`

	// network is the chain the nodes run on.
	// +optional
	// +kubebuilder:default=regtest
	Network Network `json:"network,omitempty"`

	// secretName names a Secret in the same namespace holding the RPC credentials (keys "user"
	// and "password"). Unset means the operator generates one.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	SecretName string `json:"secretName,omitempty"`

	// storage, when set, keeps each node's chain on a PersistentVolumeClaim of its own
	// (data-<network>-<n>, from the StatefulSet's volumeClaimTemplates): it survives pod
	// restarts and follows the pod to another node. Unset, the chain lives in an emptyDir
	// and goes with the pod.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="storage is immutable: a StatefulSet's volumeClaimTemplates are fixed"
	Storage *BitcoinStorage `json:"storage,omitempty"`
}

// BitcoinNodeStatus is one node of the network as the operator last saw it.
type BitcoinNodeStatus struct {
	// name of the node (its pod).
	// +required
	Name string `json:"name"`
	// ip is the node's pod IP, empty until it has one.
	// +optional
	IP string `json:"ip,omitempty"`
	// ready is true when bitcoind answers RPC and has been added to its peers.
	// +optional
	Ready bool `json:"ready,omitempty"`
}

// BitcoinNetworkStatus is reported by the Bitcoin operator.
type BitcoinNetworkStatus struct {
	// observedGeneration is the metadata.generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// readyNodes is how many nodes are ready.
	// +optional
	ReadyNodes int32 `json:"readyNodes,omitempty"`

	// peers is how many peer connections (addnode links between ready nodes) the operator has
	// established.
	// +optional
	Peers int32 `json:"peers,omitempty"`

	// nodes lists every node the operator knows about.
	// +optional
	// +listType=map
	// +listMapKey=name
	Nodes []BitcoinNodeStatus `json:"nodes,omitempty"`

	// conditions: Ready is True when readyNodes equals spec.nodes and every ready node is
	// connected to the others.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// BitcoinNetwork is a network of Bitcoin nodes (bitcoind or btcd) managed by the Bitcoin operator (seed 002).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=bitcoinnetworks,singular=bitcoinnetwork,scope=Namespaced,shortName=btc,categories={crdipc,crdipc-bitcoin}
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.spec.nodes`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyNodes`
// +kubebuilder:printcolumn:name="Network",type=string,JSONPath=`.spec.network`
// +kubebuilder:printcolumn:name="Implementation",type=string,JSONPath=`.spec.implementation`
// +kubebuilder:printcolumn:name="Peers",type=integer,JSONPath=`.status.peers`,priority=1
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BitcoinNetwork struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec may be left out entirely: every field has a default.
	// +optional
	// +kubebuilder:default={}
	Spec BitcoinNetworkSpec `json:"spec,omitempty"`
	// +optional
	Status BitcoinNetworkStatus `json:"status,omitempty"`
}

// BitcoinNetworkList is a list of BitcoinNetworks.
// +kubebuilder:object:root=true
type BitcoinNetworkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BitcoinNetwork `json:"items"`
}

// ImageOrDefault is spec.image, or the implementation's default image when it is unset.
func (s *BitcoinNetworkSpec) ImageOrDefault() string {
	switch {
	case s.Image != "":
		return s.Image
	case s.Implementation == ImplementationBtcd:
		return BtcdImage
	default:
		return BitcoindImage
	}
}

// GetConditions implements conditions.Object.
func (o *BitcoinNetwork) GetConditions() []metav1.Condition { return o.Status.Conditions }

// SetConditions implements conditions.Object.
func (o *BitcoinNetwork) SetConditions(c []metav1.Condition) { o.Status.Conditions = c }

// GetObservedGeneration implements conditions.Object.
func (o *BitcoinNetwork) GetObservedGeneration() int64 { return o.Status.ObservedGeneration }

// SetObservedGeneration implements conditions.Object.
func (o *BitcoinNetwork) SetObservedGeneration(g int64) { o.Status.ObservedGeneration = g }
