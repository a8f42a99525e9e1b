package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Field selector paths served by the API server (CRD selectableFields), so that an agent lists
// and watches only its own node's objects instead of filtering the whole cluster client-side.
const (
	// FieldNodeName selects CStorPools and CStorVolumeReplicas by spec.nodeName.
	FieldNodeName = "spec.nodeName"
	// FieldClaim selects CStorPools by spec.claim.
	FieldClaim = "spec.claim"
	// FieldPool selects CStorVolumeReplicas by spec.pool.
	FieldPool = "spec.pool"
	// FieldVolume selects CStorVolumeReplicas by spec.volume.
	FieldVolume = "spec.volume"
)

// PoolPhase is the lifecycle phase of a CStorPool as reported by its node's agent.
// +kubebuilder:validation:Enum=Init;Healthy;Offline;Degraded;Error;PoolCreationFailed;DeletionFailed
type PoolPhase string

// Pool phases, as in cStor.
const (
	// PoolPhaseInit: the agent has not created (or imported) the pool yet.
	PoolPhaseInit     PoolPhase = "Init"
	PoolPhaseHealthy  PoolPhase = "Healthy"
	PoolPhaseOffline  PoolPhase = "Offline"
	PoolPhaseDegraded PoolPhase = "Degraded"
	PoolPhaseError    PoolPhase = "Error"
	// PoolPhaseCreationFailed: creating the pool failed; the agent retries with backoff.
	PoolPhaseCreationFailed PoolPhase = "PoolCreationFailed"
	// PoolPhaseDeletionFailed: deleting the pool's data failed; the finalizer stays.
	PoolPhaseDeletionFailed PoolPhase = "DeletionFailed"
)

// CStorPoolSpec is a pool the operator wants on one node. The operator copies poolType, backend
// and capacity from the claim so the agent never needs to read the claim.
type CStorPoolSpec struct {
	// nodeName is the node whose agent owns this pool.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="nodeName is immutable"
	NodeName string `json:"nodeName"`

	// claim is the name of the StoragePoolClaim this pool belongs to.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="claim is immutable"
	Claim string `json:"claim"`

	// capacity of the pool.
	// +required
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="capacity must be greater than zero"
	// Less than 8Ei (2^63 bytes): what fits the int64 byte counts of every consumer.
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isLessThan(quantity('8Ei'))",message="capacity must be less than 8Ei"
	Capacity resource.Quantity `json:"capacity"`

	// poolType is the redundancy layout of the pool.
	// +optional
	// +kubebuilder:default=striped
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="poolType is immutable"
	PoolType PoolType `json:"poolType,omitempty"`

	// backend is how the agent stores the pool.
	// +optional
	// +kubebuilder:default=file
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="backend is immutable"
	Backend Backend `json:"backend,omitempty"`
}

// PoolCapacity is the space of a pool as the agent measured it.
type PoolCapacity struct {
	// +optional
	Total resource.Quantity `json:"total,omitempty"`
	// +optional
	Used resource.Quantity `json:"used,omitempty"`
	// +optional
	Free resource.Quantity `json:"free,omitempty"`
}

// CStorPoolStatus is reported by the agent on spec.nodeName.
type CStorPoolStatus struct {
	// observedGeneration is the metadata.generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// phase of the pool; empty until the agent first sees it.
	// +optional
	Phase PoolPhase `json:"phase,omitempty"`

	// capacity as measured on the node.
	// +optional
	Capacity *PoolCapacity `json:"capacity,omitempty"`

	// conditions: Ready is True when the pool is Healthy.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// CStorPool is one pool on one node for one claim (seed 000, step 3). The operator creates it
// with a deterministic name; the agent on spec.nodeName creates the pool and reports status.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=cstorpools,singular=cstorpool,scope=Cluster,shortName=csp,categories={crdipc,crdipc-storage}
// +kubebuilder:selectablefield:JSONPath=`.spec.nodeName`
// +kubebuilder:selectablefield:JSONPath=`.spec.claim`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Claim",type=string,JSONPath=`.spec.claim`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Total",type=string,JSONPath=`.status.capacity.total`
// +kubebuilder:printcolumn:name="Free",type=string,JSONPath=`.status.capacity.free`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,priority=1
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type CStorPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec CStorPoolSpec `json:"spec"`
	// +optional
	Status CStorPoolStatus `json:"status,omitempty"`
}

// CStorPoolList is a list of CStorPools.
// +kubebuilder:object:root=true
type CStorPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CStorPool `json:"items"`
}

// GetConditions implements conditions.Object.
func (o *CStorPool) GetConditions() []metav1.Condition { return o.Status.Conditions }

// SetConditions implements conditions.Object.
func (o *CStorPool) SetConditions(c []metav1.Condition) { o.Status.Conditions = c }

// GetObservedGeneration implements conditions.Object.
func (o *CStorPool) GetObservedGeneration() int64 { return o.Status.ObservedGeneration }

// SetObservedGeneration implements conditions.Object.
func (o *CStorPool) SetObservedGeneration(g int64) { o.Status.ObservedGeneration = g }
