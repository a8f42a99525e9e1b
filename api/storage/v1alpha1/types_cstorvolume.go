package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultReplicationFactor is spec.replicationFactor when the user leaves it out.
const DefaultReplicationFactor int32 = 3

// VolumePhase is the lifecycle phase of a CStorVolume as reported by the operator.
// +kubebuilder:validation:Enum=Init;Healthy;Degraded;Offline;Error
type VolumePhase string

const (
	// VolumePhaseInit: no replica is Healthy yet.
	VolumePhaseInit VolumePhase = "Init"
	// VolumePhaseHealthy: every desired replica is Healthy.
	VolumePhaseHealthy VolumePhase = "Healthy"
	// VolumePhaseDegraded: at least consistencyFactor replicas are Healthy, but not all; the
	// operator places the missing ones when pools become available.
	VolumePhaseDegraded VolumePhase = "Degraded"
	// VolumePhaseOffline: fewer than consistencyFactor replicas are Healthy.
	VolumePhaseOffline VolumePhase = "Offline"
	VolumePhaseError   VolumePhase = "Error"
)

// Reasons of a volume's Ready condition besides the common ones (package conditions).
const (
	// ReasonResizing: spec.capacity grew and not every replica has grown to it yet.
	ReasonResizing = "Resizing"
	// ReasonInsufficientCapacity: spec.capacity grew beyond what a replica's pool has free;
	// no replica is grown until every one fits.
	ReasonInsufficientCapacity = "InsufficientCapacity"
)

// CStorVolumeSpec is a volume replicated over distinct pools.
// +kubebuilder:validation:XValidation:rule="!has(self.consistencyFactor) || !has(self.replicationFactor) || self.consistencyFactor <= self.replicationFactor",message="consistencyFactor must be less than or equal to replicationFactor",fieldPath=".consistencyFactor"
type CStorVolumeSpec struct {
	// capacity of the volume (and of each replica). It may grow (the operator grows every
	// replica, and a staged target then grows the volume online) but never shrink: a file
	// system cut short would lose what it wrote at the end.
	// +required
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity(string(oldSelf))) >= 0",message="capacity may grow but not shrink"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="capacity must be greater than zero"
	// Less than 8Ei (2^63 bytes): what fits the int64 byte counts of every consumer.
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isLessThan(quantity('8Ei'))",message="capacity must be less than 8Ei"
	Capacity resource.Quantity `json:"capacity"`

	// replicationFactor is how many replicas, on distinct pools, the volume has.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=5
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="replicationFactor is immutable"
	ReplicationFactor int32 `json:"replicationFactor,omitempty"`

	// consistencyFactor is how many replicas must be Healthy for the volume to serve I/O. Unset
	// means a majority, replicationFactor/2+1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	ConsistencyFactor *int32 `json:"consistencyFactor,omitempty"`

	// source, when set, fills the new volume's replicas from a snapshot or a backup instead
	// of leaving them empty: a restore, or (of a snapshot taken for it) a clone.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="source is immutable"
	Source *VolumeSource `json:"source,omitempty"`

	// ttlSecondsAfterFinished, when set, lets the operator delete the volume this many seconds
	// after it became Ready; for throwaway volumes in tests and benchmarks.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`
}

// VolumeSource is what a new volume's data comes from: a snapshot or a backup.
// +kubebuilder:validation:XValidation:rule="has(self.snapshot) != has(self.backup)",message="exactly one of snapshot and backup is required"
type VolumeSource struct {
	// snapshot is a CStorVolumeSnapshot (same namespace), ready to use, no larger than the
	// volume.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Snapshot string `json:"snapshot,omitempty"`
	// backup is a backup in a BackupStore, no larger than the volume: each replica is filled
	// from the store.
	// +optional
	Backup *BackupRef `json:"backup,omitempty"`
}

// BackupRef names a backup in a BackupStore.
type BackupRef struct {
	// store is the BackupStore.
	// +required
	// +kubebuilder:validation:MinLength=1
	Store string `json:"store"`
	// id of the backup in the store: its VolumeBackup's status.backupID.
	// +required
	// +kubebuilder:validation:MinLength=1
	ID string `json:"id"`
}

// EffectiveReplicationFactor returns spec.replicationFactor. The API server stores the CRD's
// default (3) when it is left out, so 0 is seen only on objects not yet defaulted (built in
// Go, or read through a fake client); it counts as DefaultReplicationFactor, the one rule
// every reader applies.
func (s *CStorVolumeSpec) EffectiveReplicationFactor() int32 {
	if s.ReplicationFactor == 0 {
		return DefaultReplicationFactor
	}
	return s.ReplicationFactor
}

// EffectiveConsistencyFactor returns spec.consistencyFactor, or the majority of the
// effective replication factor when it is unset.
func (s *CStorVolumeSpec) EffectiveConsistencyFactor() int32 {
	if s.ConsistencyFactor != nil {
		return *s.ConsistencyFactor
	}
	return s.EffectiveReplicationFactor()/2 + 1
}

// VolumeReplicaStatus is the operator's summary of one CStorVolumeReplica of the volume.
type VolumeReplicaStatus struct {
	// name of the CStorVolumeReplica (in the volume's namespace).
	// +required
	Name string `json:"name"`
	// pool is the CStorPool holding the replica.
	// +required
	Pool string `json:"pool"`
	// node is the pool's node.
	// +required
	Node string `json:"node"`
	// phase is the replica's phase as its agent last reported it.
	// +optional
	Phase ReplicaPhase `json:"phase,omitempty"`
	// endpoint is the replica data service serving it (the replica's status.endpoint).
	// +optional
	Endpoint string `json:"endpoint,omitempty"`
	// location is where the replica keeps its data on its node (the replica's
	// status.location).
	// +optional
	Location string `json:"location,omitempty"`
}

// CStorVolumeStatus is reported by the operator.
type CStorVolumeStatus struct {
	// observedGeneration is the metadata.generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// phase of the volume.
	// +optional
	Phase VolumePhase `json:"phase,omitempty"`

	// replicas placed so far, one entry per CStorVolumeReplica.
	// +optional
	// +listType=map
	// +listMapKey=name
	Replicas []VolumeReplicaStatus `json:"replicas,omitempty"`

	// readyReplicas is how many replicas are Healthy.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`

	// desiredReplicas is spec.replicationFactor as the operator saw it.
	// +optional
	DesiredReplicas int32 `json:"desiredReplicas,omitempty"`

	// capacity every placed replica holds, as their agents measured it: the size a target
	// may serve. Below spec.capacity while the replicas grow (Ready is then False, reason
	// Resizing).
	// +optional
	Capacity *resource.Quantity `json:"capacity,omitempty"`

	// conditions: Ready is True when every desired replica is Healthy; False with reason
	// Waiting while the operator waits for pools to place the rest.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// CStorVolume is a request for a replicated volume (seed 000). The operator turns it into
// CStorVolumeReplicas on distinct pools and reports their state here.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=cstorvolumes,singular=cstorvolume,scope=Namespaced,shortName=cv,categories={crdipc,crdipc-storage}
// +kubebuilder:printcolumn:name="Capacity",type=string,JSONPath=`.spec.capacity`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Replicas",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.desiredReplicas`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`
type CStorVolume struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec CStorVolumeSpec `json:"spec"`
	// +optional
	Status CStorVolumeStatus `json:"status,omitempty"`
}

// CStorVolumeList is a list of CStorVolumes.
// +kubebuilder:object:root=true
type CStorVolumeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CStorVolume `json:"items"`
}

// GetConditions implements conditions.Object.
func (o *CStorVolume) GetConditions() []metav1.Condition { return o.Status.Conditions }

// SetConditions implements conditions.Object.
func (o *CStorVolume) SetConditions(c []metav1.Condition) { o.Status.Conditions = c }

// GetObservedGeneration implements conditions.Object.
func (o *CStorVolume) GetObservedGeneration() int64 { return o.Status.ObservedGeneration }

// SetObservedGeneration implements conditions.Object.
func (o *CStorVolume) SetObservedGeneration(g int64) { o.Status.ObservedGeneration = g }
