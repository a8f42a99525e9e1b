package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PoolType is the redundancy layout of a pool.
// +kubebuilder:validation:Enum=striped;mirrored;raidz;raidz2
type PoolType string

// Pool types, as in cStor.
const (
	PoolTypeStriped  PoolType = "striped"
	PoolTypeMirrored PoolType = "mirrored"
	PoolTypeRaidz    PoolType = "raidz"
	PoolTypeRaidz2   PoolType = "raidz2"
)

// Backend is how a pool agent stores pools and replicas on its node.
// +kubebuilder:validation:Enum=file;zfs
type Backend string

const (
	// BackendFile keeps a pool as a directory and each replica as a sparse file in it.
	BackendFile Backend = "file"
	// BackendZFS keeps a pool as a zpool and each replica as a zvol.
	BackendZFS Backend = "zfs"
)

// StoragePoolClaimSpec asks for pools on the nodes that match nodeSelector.
// +kubebuilder:validation:XValidation:rule="!has(self.maxPools) || !has(self.minPools) || self.minPools <= self.maxPools",message="minPools must be less than or equal to maxPools",fieldPath=".minPools"
type StoragePoolClaimSpec struct {
	// poolType is the redundancy layout of every pool of this claim.
	// +optional
	// +kubebuilder:default=striped
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="poolType is immutable"
	PoolType PoolType `json:"poolType,omitempty"`

	// minPools is how many healthy pools the claim needs to be Ready.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	MinPools int32 `json:"minPools,omitempty"`

	// maxPools caps how many pools (one per node) the operator creates. Unset means one pool on
	// every matching node, including nodes that join later.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxPools *int32 `json:"maxPools,omitempty"`

	// nodeSelector restricts the nodes that get a pool; empty means every Ready node.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// capacity of each pool.
	// +required
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="capacity must be greater than zero"
	// Less than 8Ei (2^63 bytes): what fits the int64 byte counts of every consumer.
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isLessThan(quantity('8Ei'))",message="capacity must be less than 8Ei"
	Capacity resource.Quantity `json:"capacity"`

	// backend is how agents store the pools.
	// +optional
	// +kubebuilder:default=file
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="backend is immutable"
	Backend Backend `json:"backend,omitempty"`
}

// StoragePoolClaimStatus is the operator's view of the claim's pools.
type StoragePoolClaimStatus struct {
	// observedGeneration is the metadata.generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// desiredPools is how many pools the claim should have now: the matching nodes, capped at
	// maxPools.
	// +optional
	DesiredPools int32 `json:"desiredPools,omitempty"`

	// provisionedPools is how many CStorPools exist for the claim.
	// +optional
	ProvisionedPools int32 `json:"provisionedPools,omitempty"`

	// healthyPools is how many of them are in phase Healthy.
	// +optional
	HealthyPools int32 `json:"healthyPools,omitempty"`

	// conditions: Ready is True when healthyPools >= minPools.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// StoragePoolClaim asks the storage operator for a pool on each matching node (seed 000, step 1).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=storagepoolclaims,singular=storagepoolclaim,scope=Cluster,shortName=spc,categories={crdipc,crdipc-storage}
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.poolType`
// +kubebuilder:printcolumn:name="Backend",type=string,JSONPath=`.spec.backend`
// +kubebuilder:printcolumn:name="Capacity",type=string,JSONPath=`.spec.capacity`,priority=1
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.desiredPools`
// +kubebuilder:printcolumn:name="Provisioned",type=integer,JSONPath=`.status.provisionedPools`
// +kubebuilder:printcolumn:name="Healthy",type=integer,JSONPath=`.status.healthyPools`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type StoragePoolClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec StoragePoolClaimSpec `json:"spec"`
	// +optional
	Status StoragePoolClaimStatus `json:"status,omitempty"`
}

// StoragePoolClaimList is a list of StoragePoolClaims.
// +kubebuilder:object:root=true
type StoragePoolClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []StoragePoolClaim `json:"items"`
}

// GetConditions implements conditions.Object.
func (o *StoragePoolClaim) GetConditions() []metav1.Condition { return o.Status.Conditions }

// SetConditions implements conditions.Object.
func (o *StoragePoolClaim) SetConditions(c []metav1.Condition) { o.Status.Conditions = c }

// GetObservedGeneration implements conditions.Object.
func (o *StoragePoolClaim) GetObservedGeneration() int64 { return o.Status.ObservedGeneration }

// SetObservedGeneration implements conditions.Object.
func (o *StoragePoolClaim) SetObservedGeneration(g int64) { o.Status.ObservedGeneration = g }
