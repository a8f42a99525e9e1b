package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReplicaPhase is the lifecycle phase of a CStorVolumeReplica as reported by its node's agent.
// +kubebuilder:validation:Enum=Init;Healthy;Rebuilding;Offline;Error;DeletionFailed
type ReplicaPhase string

const (
	// ReplicaPhaseInit: the agent has not created the replica yet.
	ReplicaPhaseInit    ReplicaPhase = "Init"
	ReplicaPhaseHealthy ReplicaPhase = "Healthy"
	// ReplicaPhaseRebuilding: the replica is new or fell behind and is being filled from a
	// healthy replica; it receives new writes but is not read from, nor counted towards the
	// consistency factor, until it is done (status.rebuild shows the progress).
	ReplicaPhaseRebuilding ReplicaPhase = "Rebuilding"
	ReplicaPhaseOffline    ReplicaPhase = "Offline"
	ReplicaPhaseError      ReplicaPhase = "Error"
	// ReplicaPhaseDeletionFailed: deleting the replica's data failed; the finalizer stays.
	ReplicaPhaseDeletionFailed ReplicaPhase = "DeletionFailed"
)

// CStorVolumeReplicaSpec places one replica of a volume on one pool. Every field but
// capacity (which grows with the volume) is fixed at creation: moving a replica means
// deleting it and creating another.
type CStorVolumeReplicaSpec struct {
	// volume is the name of the CStorVolume (same namespace) this replica belongs to.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="volume is immutable"
	Volume string `json:"volume"`

	// pool is the name of the CStorPool holding the replica.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="pool is immutable"
	Pool string `json:"pool"`

	// nodeName is the pool's node, copied here so the node's agent can select its replicas.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="nodeName is immutable"
	NodeName string `json:"nodeName"`

	// source, when set, is what the agent fills a new replica from before it is Healthy (its
	// volume's spec.source): a snapshot, read over the data path from a replica holding a
	// copy, or a backup, read from its store.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="source is immutable"
	Source *ReplicaSource `json:"source,omitempty"`

	// capacity of the replica: the volume's, which the operator copies here. It may grow
	// (the agent grows the data) but never shrink.
	// +required
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity(string(oldSelf))) >= 0",message="capacity may grow but not shrink"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="capacity must be greater than zero"
	// Less than 8Ei (2^63 bytes): what fits the int64 byte counts of every consumer.
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isLessThan(quantity('8Ei'))",message="capacity must be less than 8Ei"
	Capacity resource.Quantity `json:"capacity"`
}

// ReplicaSource is what a new replica is filled from: a snapshot, of whose copies the agent
// reads whichever it can reach, or a backup, which it reads from its store.
// +kubebuilder:validation:XValidation:rule="has(self.snapshot) != has(self.backup)",message="exactly one of snapshot and backup is required"
type ReplicaSource struct {
	// snapshot is the CStorVolumeSnapshot (same namespace).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Snapshot string `json:"snapshot,omitempty"`
	// backup is a backup in a BackupStore.
	// +optional
	Backup *BackupRef `json:"backup,omitempty"`
}

// ReplicaCapacity is the space of a replica as the agent measured it.
type ReplicaCapacity struct {
	// total is the replica's logical size.
	// +optional
	Total resource.Quantity `json:"total,omitempty"`
	// used is the space actually allocated (replicas are sparse).
	// +optional
	Used resource.Quantity `json:"used,omitempty"`
}

// ReplicaRebuild is the progress of a replica being filled from a healthy one.
type ReplicaRebuild struct {
	// source is the replica (CStorVolumeReplica name) the data comes from.
	// +optional
	Source string `json:"source,omitempty"`
	// doneBytes of allocated data copied so far, of totalBytes.
	// +optional
	DoneBytes int64 `json:"doneBytes,omitempty"`
	// totalBytes of allocated data to copy; holes are not copied.
	// +optional
	TotalBytes int64 `json:"totalBytes,omitempty"`
	// progress is doneBytes/totalBytes as a percentage, for kubectl get.
	// +optional
	Progress string `json:"progress,omitempty"`
	// error is why the last attempt failed; the agent tries again.
	// +optional
	Error string `json:"error,omitempty"`
}

// CStorVolumeReplicaStatus is reported by the agent on spec.nodeName.
type CStorVolumeReplicaStatus struct {
	// observedGeneration is the metadata.generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// phase of the replica; empty until the agent first sees it.
	// +optional
	Phase ReplicaPhase `json:"phase,omitempty"`

	// capacity as measured on the node.
	// +optional
	Capacity *ReplicaCapacity `json:"capacity,omitempty"`

	// endpoint is the address (host:port) of the node's replica data service, which serves
	// this replica's data to the volume's target and to peers rebuilding from it (mutual TLS).
	// +optional
	Endpoint string `json:"endpoint,omitempty"`

	// location is where the replica keeps its data on its node, as its agent found it: an
	// absolute file path (file backend) or a zvol device (zfs backend).
	// +optional
	Location string `json:"location,omitempty"`

	// revision counts the writes the replica holds, as its node last reported it; of two
	// replicas of a volume, the one with the higher revision is the fresher.
	// +optional
	Revision int64 `json:"revision,omitempty"`

	// sourceFilled is set once the replica holds its spec.source snapshot's data (or there
	// was none to copy): it is never filled again, even after the snapshot is deleted.
	// +optional
	SourceFilled bool `json:"sourceFilled,omitempty"`

	// rebuild is set while the replica is Rebuilding.
	// +optional
	Rebuild *ReplicaRebuild `json:"rebuild,omitempty"`

	// conditions: Ready is True when the replica is Healthy.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// CStorVolumeReplica is one replica of a CStorVolume on one pool, named
// <volume>-<pool>-<hash>. The operator creates it; the agent on spec.nodeName creates the data.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=cstorvolumereplicas,singular=cstorvolumereplica,scope=Namespaced,shortName=cvr,categories={crdipc,crdipc-storage}
// +kubebuilder:selectablefield:JSONPath=`.spec.nodeName`
// +kubebuilder:selectablefield:JSONPath=`.spec.pool`
// +kubebuilder:selectablefield:JSONPath=`.spec.volume`
// +kubebuilder:printcolumn:name="Volume",type=string,JSONPath=`.spec.volume`
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.pool`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Rebuilt",type=string,JSONPath=`.status.rebuild.progress`
// +kubebuilder:printcolumn:name="Capacity",type=string,JSONPath=`.spec.capacity`
// +kubebuilder:printcolumn:name="Used",type=string,JSONPath=`.status.capacity.used`,priority=1
// +kubebuilder:printcolumn:name="Revision",type=integer,JSONPath=`.status.revision`,priority=1
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpoint`,priority=1
// +kubebuilder:printcolumn:name="Location",type=string,JSONPath=`.status.location`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type CStorVolumeReplica struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec CStorVolumeReplicaSpec `json:"spec"`
	// +optional
	Status CStorVolumeReplicaStatus `json:"status,omitempty"`
}

// CStorVolumeReplicaList is a list of CStorVolumeReplicas.
// +kubebuilder:object:root=true
type CStorVolumeReplicaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CStorVolumeReplica `json:"items"`
}

// GetConditions implements conditions.Object.
func (o *CStorVolumeReplica) GetConditions() []metav1.Condition { return o.Status.Conditions }

// SetConditions implements conditions.Object.
func (o *CStorVolumeReplica) SetConditions(c []metav1.Condition) { o.Status.Conditions = c }

// GetObservedGeneration implements conditions.Object.
func (o *CStorVolumeReplica) GetObservedGeneration() int64 { return o.Status.ObservedGeneration }

// SetObservedGeneration implements conditions.Object.
func (o *CStorVolumeReplica) SetObservedGeneration(g int64) { o.Status.ObservedGeneration = g }
