package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LabelSnapshotNode names the node whose CSI driver takes a CStorVolumeSnapshot: the node
// the volume is published to (its target runs there), or the one that asked.
const LabelSnapshotNode = "storage.crdipc.io/node"

// CStorVolumeSnapshotSpec asks for a crash-consistent point-in-time copy of a volume.
type CStorVolumeSnapshotSpec struct {
	// volume is the CStorVolume (same namespace) to copy.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="volume is immutable"
	Volume string `json:"volume"`
}

// SnapshotCopy is one replica's copy of the volume.
type SnapshotCopy struct {
	// replica is the CStorVolumeReplica whose node holds the copy, next to its data.
	// +required
	Replica string `json:"replica"`
	// node is the replica's node.
	// +required
	Node string `json:"node"`
}

// CStorVolumeSnapshotStatus is reported by the CSI driver that took the snapshot.
type CStorVolumeSnapshotStatus struct {
	// observedGeneration is the metadata.generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// readyToUse is true once every copy is durable: the snapshot can be restored.
	// +optional
	ReadyToUse bool `json:"readyToUse,omitempty"`

	// creationTime is when writes to the volume were held for the copy: the point in time
	// the snapshot shows.
	// +optional
	CreationTime *metav1.Time `json:"creationTime,omitempty"`

	// size of the volume at that time: what a restore needs at least.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`

	// copies are the replicas holding an identical copy (at least the volume's consistency
	// factor of them).
	// +optional
	// +listType=map
	// +listMapKey=replica
	Copies []SnapshotCopy `json:"copies,omitempty"`

	// takenBy is the node whose driver took it, and whether through the volume's running
	// target (writes held, file system frozen) or one started for the copy.
	// +optional
	TakenBy string `json:"takenBy,omitempty"`

	// conditions: Ready is True once readyToUse.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// CStorVolumeSnapshot is a request for a point-in-time copy of a CStorVolume, made by the
// CSI driver's CreateSnapshot and taken by the driver that runs the volume's target: writes
// are held, every healthy replica copies its data next to it (reflink or sparse copy), and
// writes go on. A volume restored or cloned from it names it in spec.source.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=cstorvolumesnapshots,singular=cstorvolumesnapshot,scope=Namespaced,shortName=cvsnap,categories={crdipc,crdipc-storage}
// +kubebuilder:selectablefield:JSONPath=`.spec.volume`
// +kubebuilder:printcolumn:name="Volume",type=string,JSONPath=`.spec.volume`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="ReadyToUse",type=boolean,JSONPath=`.status.readyToUse`
// +kubebuilder:printcolumn:name="Taken",type=date,JSONPath=`.status.creationTime`
// +kubebuilder:printcolumn:name="By",type=string,JSONPath=`.status.takenBy`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:printcolumn:name="Message",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].message`
type CStorVolumeSnapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec CStorVolumeSnapshotSpec `json:"spec"`
	// +optional
	Status CStorVolumeSnapshotStatus `json:"status,omitempty"`
}

// CStorVolumeSnapshotList is a list of CStorVolumeSnapshots.
// +kubebuilder:object:root=true
type CStorVolumeSnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CStorVolumeSnapshot `json:"items"`
}

// GetConditions implements conditions.Object.
func (o *CStorVolumeSnapshot) GetConditions() []metav1.Condition { return o.Status.Conditions }

// SetConditions implements conditions.Object.
func (o *CStorVolumeSnapshot) SetConditions(c []metav1.Condition) { o.Status.Conditions = c }

// GetObservedGeneration implements conditions.Object.
func (o *CStorVolumeSnapshot) GetObservedGeneration() int64 { return o.Status.ObservedGeneration }

// SetObservedGeneration implements conditions.Object.
func (o *CStorVolumeSnapshot) SetObservedGeneration(g int64) { o.Status.ObservedGeneration = g }
