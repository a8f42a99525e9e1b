package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BranchState is what last happened to a branch, from GitHub create, push and delete events.
// +kubebuilder:validation:Enum=created;pushed;deleted
type BranchState string

const (
	BranchCreated BranchState = "created"
	BranchPushed  BranchState = "pushed"
	BranchDeleted BranchState = "deleted"
)

// BranchSpec mirrors a GitHub branch as last seen in a webhook delivery (seed 003: name and
// state, plus the repository so branches of different repositories do not collide).
type BranchSpec struct {
	// name of the branch, without refs/heads/.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="name is immutable"
	Name string `json:"name"`

	// state is what last happened to the branch.
	// +required
	State BranchState `json:"state"`

	// repository is the repository as "owner/name".
	// +required
	// +kubebuilder:validation:MaxLength=140
	// +kubebuilder:validation:XValidation:rule="self.matches('^[A-Za-z0-9][A-Za-z0-9-]*/[A-Za-z0-9._-]+$')",message="repository must be owner/name"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="repository is immutable"
	Repository string `json:"repository"`

	// headSha is the commit the branch points to (all zeros after a delete, as GitHub sends).
	// +optional
	// +kubebuilder:validation:MaxLength=40
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9a-f]{40}$')",message="headSha must be a 40-character lowercase hex commit SHA"
	HeadSHA string `json:"headSha,omitempty"`

	// updatedAt is the time of the event that wrote this spec; the listener ignores an older
	// delivery that arrives late.
	// +optional
	UpdatedAt *metav1.Time `json:"updatedAt,omitempty"`
}

// BranchStatus follows the crdipc status contract.
type BranchStatus struct {
	// observedGeneration is the metadata.generation this status was computed for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// Branch is a GitHub branch written by the webhook listener (seed 003).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=branches,singular=branch,scope=Namespaced,shortName=br,categories={crdipc,crdipc-scm}
// +kubebuilder:printcolumn:name="Repository",type=string,JSONPath=`.spec.repository`
// +kubebuilder:printcolumn:name="Branch",type=string,JSONPath=`.spec.name`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.spec.state`
// +kubebuilder:printcolumn:name="Head",type=string,JSONPath=`.spec.headSha`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Branch struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec BranchSpec `json:"spec"`
	// +optional
	Status BranchStatus `json:"status,omitempty"`
}

// BranchList is a list of Branches.
// +kubebuilder:object:root=true
type BranchList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Branch `json:"items"`
}

// GetConditions implements conditions.Object.
func (o *Branch) GetConditions() []metav1.Condition { return o.Status.Conditions }

// SetConditions implements conditions.Object.
func (o *Branch) SetConditions(c []metav1.Condition) { o.Status.Conditions = c }

// GetObservedGeneration implements conditions.Object.
func (o *Branch) GetObservedGeneration() int64 { return o.Status.ObservedGeneration }

// SetObservedGeneration implements conditions.Object.
func (o *Branch) SetObservedGeneration(g int64) { o.Status.ObservedGeneration = g }
